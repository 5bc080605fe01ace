"""Socket-LB: the cgroup sock_addr programs, assembled here, following Cilium's bpf_sock.c.

Forward translation (``connect4/6``, ``sendmsg4/6``), as ``__sock4_xlate_fwd``:

1. the frontend key ``{user_ip, user_port, slot 0, protocol, scope EXT}`` is looked up in the
   services map; a Service with ``TWO_SCOPES`` is looked up again with scope INT (east-west
   traffic uses the internal backend set, ``lb4_lookup_service(key, true)``);
2. a miss to a loopback address on a NodePort port (30000-32767) retries the wildcard
   surrogate (address 0), kept only if it is a NodePort (``sock4_wildcard_lookup``); another
   miss leaves the socket untranslated;
3. an ExternalIP Service is not translated (``sock4_skip_xlate``: Cilium translates it only
   when the address is the host's own, which needs its ipcache; kproxy's NodePort frontends
   are expanded per node address, so node addresses hit directly);
4. ``count == 0``: the connect is refused with ``EHOSTUNREACH`` (``bpf_set_retval``, then
   ``SYS_REJECT``), as newer Cilium does for a Service without backends;
5. with ``AFFINITY``, the affinity map keyed by the caller's network-namespace cookie and the
   service id gives the backend while ``last_used + timeout > now`` (seconds,
   ``bpf_mono_now``) and ``{backend_id, rev_nat_index}`` is in the affinity-match map; else
   the stale entry is deleted;
6. otherwise slot ``(TCP ? prandom : socket cookie) % count + 1`` is read
   (``sock_select_slot``) and its backend looked up; a missing slot or backend leaves the
   socket untranslated; a newly chosen backend is written to the affinity map;
7. the reverse entry ``{socket cookie, backend} -> {frontend, rev_nat_index}`` is written to
   the socket reverse-NAT map (its failure refuses with ``ENOMEM``); the destination becomes
   the backend.

Reverse translation (``recvmsg4/6``, ``getpeername4/6``), as ``__sock4_xlate_rev``: the entry
for ``{socket cookie, peer}`` names the frontend; when the services map still has that
frontend with the same ``rev_nat_index``, the peer shown becomes the frontend, else the stale
entry is deleted. Every program returns 1 (proceed) except the refusals of step 4 and 7.

An IPv6 hook's ``::ffff:a.b.c.d`` with no IPv6 frontend goes through the IPv4 maps and comes
back as ``::ffff:backend`` (``sock6_xlate_v4_in_v6``) when both families are loaded.

Not modelled: the host-namespace-only option,
health-check sockets, local-redirect Services and the L7 proxy.

Map names the programs load (fds given at assembly): ``services``, ``backends``,
``reverse_sk`` and, with affinity, ``affinity`` and ``affinity_match``; their layouts are
:mod:`kproxy.modes.ebpf.layout`'s.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

from emulation.bpf import R0, R1, R2, R3, R4, R6, R7, R8, R9, R10, Asm, AttachType, Helper, Reg
from kproxy.model import IPFamily

__all__ = [
    "FORWARD_HOOKS",
    "NODEPORT_MAX",
    "NODEPORT_MIN",
    "REVERSE_HOOKS",
    "SOCK_MAPS",
    "sock_forward",
    "sock_program",
    "sock_reverse",
]

#: Cilium's default NodePort range (``NODEPORT_PORT_MIN``, ``NODEPORT_PORT_MAX``).
NODEPORT_MIN, NODEPORT_MAX = 30000, 32767
#: The hooks of forward and reverse translation, per family.
FORWARD_HOOKS = {
    IPFamily.IPv4: (AttachType.CGROUP_INET4_CONNECT, AttachType.CGROUP_UDP4_SENDMSG),
    IPFamily.IPv6: (AttachType.CGROUP_INET6_CONNECT, AttachType.CGROUP_UDP6_SENDMSG),
}
REVERSE_HOOKS = {
    IPFamily.IPv4: (AttachType.CGROUP_UDP4_RECVMSG, AttachType.CGROUP_INET4_GETPEERNAME),
    IPFamily.IPv6: (AttachType.CGROUP_UDP6_RECVMSG, AttachType.CGROUP_INET6_GETPEERNAME),
}
#: The map kinds (:func:`kproxy.modes.ebpf.layout.map_spec`) the programs use, by asm name.
SOCK_MAPS = {"services": "services_v2", "backends": "backends_v3", "reverse_sk": "reverse_sk",
             "affinity": "affinity", "affinity_match": "affinity_match"}

# lb.h flag bits the programs test (kproxy.modes.ebpf.layout.ServiceFlag, ServiceFlag2).
_F_EXTERNAL_IP, _F_NODEPORT, _F_AFFINITY = 1 << 0, 1 << 1, 1 << 4
_F2_TWO_SCOPES = 1 << 5
_NSEC_PER_SEC = 1_000_000_000
_TIMEOUT_MASK = (1 << 24) - 1

# The stack frame (offsets from r10; every field aligned to its size, as the verifier wants).
_KEY = -64  # lb4_key / lb6_key: addr, dport, backend_slot, proto, scope, pad[2]
_RVAL = -88  # ipv4/6_revnat_entry: addr, port, rev_nat_index
_RKEY = -120  # ipv4/6_revnat_tuple: cookie, addr, port, pad
_BKEY = -124  # backend id
_AKEY = -152  # lb4/6_affinity_key: cookie (8, union), rev_nat_id, netns_cookie bit, pads
_AVAL = -168  # lb_affinity_val: last_used, backend_id, pad
_MKEY = -176  # lb_affinity_match key: backend_id, rev_nat_id, pad
# bpf_sock_addr offsets
_USER_IP4, _USER_IP6, _USER_PORT, _PROTOCOL = 4, 8, 24, 36


@dataclass(frozen=True, slots=True)
class _Gen:
    """How one translation is generated: the key family, where the address sits in the
    context, which maps (``sfx``: "" for the hook's own family, "4" for the IPv4 maps of an
    IPv4-in-IPv6 fallback), the label suffix, and whether the context holds ``::ffff:a.b.c.d``."""

    family: IPFamily
    ip_off: int
    sfx: str = ""
    tag: str = ""
    mapped: bool = False

    @property
    def alen(self) -> int:
        return 16 if self.family is IPFamily.IPv6 else 4

    def m(self, name: str) -> str:
        return name + self.sfx

    def lbl(self, name: str) -> str:
        return name + self.tag


def _gen(family: IPFamily) -> _Gen:
    return _Gen(family, _USER_IP6 if family is IPFamily.IPv6 else _USER_IP4)


#: The IPv4 translation of an IPv6 hook's ``::ffff:a.b.c.d`` (Cilium's ``sock6_xlate_v4_in_v6``).
_V4_IN_V6 = _Gen(IPFamily.IPv4, _USER_IP6 + 12, sfx="4", tag="_v4in6", mapped=True)
#: ``::ffff:0:0/96`` as the first three words of ``user_ip6`` read little-endian.
_MAPPED_PREFIX = (0, 0, 0xFFFF_0000)


def _copy(a: Asm, dst: Reg, dst_off: int, src: Reg, src_off: int, n: int) -> None:
    """Copy ``n`` bytes (a multiple of 4) in words through r2."""
    for i in range(0, n, 4):
        a.ldx(4, R2, src, src_off + i).stx(4, dst, dst_off + i, R2)


def _lookup(a: Asm, name: str, key_off: int) -> None:
    a.ld_map(R1, name).mov(R2, R10).add(R2, key_off).call(Helper.MAP_LOOKUP_ELEM)


def _jump_unless_mapped(a: Asm, miss: str) -> None:
    """Jump to ``miss`` unless the context's ``user_ip6`` is ``::ffff:a.b.c.d``."""
    for i, word in enumerate(_MAPPED_PREFIX):
        a.ldx(4, R2, R6, _USER_IP6 + 4 * i).jne(R2, word, miss, jmp32=True)


def _write_address(a: Asm, g: _Gen, src: Reg, src_off: int) -> None:
    """The context's address and port := the ``alen`` bytes and port at ``src + src_off``."""
    if g.mapped:
        for i, word in enumerate(_MAPPED_PREFIX):
            a.st(4, R6, _USER_IP6 + 4 * i, word - (1 << 32) if word >> 31 else word)
    _copy(a, R6, g.ip_off, src, src_off, g.alen)
    a.ldx(2, R2, src, src_off + g.alen).stx(4, R6, _USER_PORT, R2)


def _frontend_key(a: Asm, g: _Gen) -> None:
    alen = g.alen
    _copy(a, R10, _KEY, R6, g.ip_off, alen)
    a.ldx(4, R2, R6, _USER_PORT).stx(2, R10, _KEY + alen, R2)
    a.st(2, R10, _KEY + alen + 2, 0)
    a.ldx(4, R2, R6, _PROTOCOL).stx(1, R10, _KEY + alen + 4, R2)
    a.st(1, R10, _KEY + alen + 5, 0).st(2, R10, _KEY + alen + 6, 0)
    # the reverse entry's frontend, before the key changes
    _copy(a, R10, _RVAL, R6, g.ip_off, alen)
    a.ldx(4, R2, R6, _USER_PORT).stx(2, R10, _RVAL + alen, R2)


def _loopback_wildcard(a: Asm, g: _Gen, miss: str) -> None:
    """Jump to ``miss`` unless the key is loopback on a NodePort port; then zero the address."""
    alen = g.alen
    if g.family is IPFamily.IPv4:
        a.ldx(1, R2, R10, _KEY).jne(R2, 127, miss)
    else:
        for i in range(0, 12, 4):
            a.ldx(4, R2, R10, _KEY + i).jne(R2, 0, miss)
        a.ldx(4, R2, R10, _KEY + 12).jne(R2, 0x0100_0000, miss)  # ::1, its last word read LE
    a.ldx(2, R2, R10, _KEY + alen).endian(R2, 16, big=True)  # the port in host order
    a.jlt(R2, NODEPORT_MIN, miss).jgt(R2, NODEPORT_MAX, miss)
    for i in range(0, alen, 4):
        a.st(4, R10, _KEY + i, 0)


def _lookup_service(a: Asm, g: _Gen, miss: str) -> None:
    """r7 = the frontend's master entry (east-west: INT scope for two-scope Services)."""
    alen, found, ok = g.alen, g.lbl("svc_found" + miss), g.lbl("svc_ok" + miss)
    _lookup(a, g.m("services"), _KEY)
    a.jne(R0, 0, found)
    _loopback_wildcard(a, g, miss)
    _lookup(a, g.m("services"), _KEY)
    a.jeq(R0, 0, miss)
    a.ldx(1, R2, R0, 8).jset(R2, _F_NODEPORT, found).ja(miss)
    a.label(found)
    a.mov(R7, R0)
    a.ldx(1, R2, R7, 9).jset(R2, _F2_TWO_SCOPES, g.lbl("two_scopes" + miss)).ja(ok)
    a.label(g.lbl("two_scopes" + miss)).st(1, R10, _KEY + alen + 5, 1)
    _lookup(a, g.m("services"), _KEY)
    a.jeq(R0, 0, miss).mov(R7, R0)
    a.label(ok)


def _refuse(a: Asm, err: int) -> None:
    a.mov(R1, -err).call(Helper.SET_RETVAL).mov(R0, 0).exit()


def _affinity(a: Asm, g: _Gen) -> None:
    """r9 = the backend the affinity map still holds for this netns and Service, else 0."""
    akey_len = 24 if g.family is IPFamily.IPv6 else 16
    done, stale = g.lbl("aff_done"), g.lbl("aff_stale")
    a.mov(R9, 0)
    a.ldx(1, R2, R7, 8).jset(R2, _F_AFFINITY, g.lbl("aff_on")).ja(done)
    a.label(g.lbl("aff_on"))
    a.mov(R1, R6).call(Helper.GET_NETNS_COOKIE).stx(8, R10, _AKEY, R0)
    for i in range(8, akey_len - 8, 8):
        a.st(8, R10, _AKEY + i, 0)
    tail = _AKEY + akey_len - 8
    a.ldx(2, R2, R7, 6).stx(2, R10, tail, R2).st(1, R10, tail + 2, 1).st(1, R10, tail + 3, 0)
    a.st(4, R10, tail + 4, 0)
    _lookup(a, g.m("affinity"), _AKEY)
    a.jeq(R0, 0, done).mov(R8, R0)
    a.call(Helper.KTIME_GET_NS).div(R0, _NSEC_PER_SEC).stx(8, R10, _AVAL, R0)
    a.ldx(4, R2, R7, 0).and_(R2, _TIMEOUT_MASK).ldx(8, R3, R8, 0).add(R3, R2)
    a.jle(R3, R0, stale)
    a.ldx(4, R2, R8, 8).stx(4, R10, _MKEY, R2).ldx(2, R2, R7, 6).stx(2, R10, _MKEY + 4, R2)
    a.st(2, R10, _MKEY + 6, 0)
    _lookup(a, "affinity_match", _MKEY)
    a.jeq(R0, 0, stale)
    a.ldx(8, R2, R10, _AVAL).stx(8, R8, 0, R2).ldx(4, R9, R8, 8)
    a.stx(4, R10, _BKEY, R9)
    _lookup(a, g.m("backends"), _BKEY)
    a.jne(R0, 0, done).mov(R9, 0).ja(done)
    a.label(stale)
    a.ld_map(R1, g.m("affinity")).mov(R2, R10).add(R2, _AKEY).call(Helper.MAP_DELETE_ELEM)
    a.label(done)


def _select(a: Asm, g: _Gen, miss: str) -> None:
    """r9 = the backend of slot ``(TCP ? prandom : cookie) % count + 1``; r8 = the backend."""
    alen = g.alen
    have, rev = g.lbl("have_backend"), g.lbl("rev")
    a.jne(R9, 0, have)
    a.ldx(4, R2, R6, _PROTOCOL).jne(R2, 6, g.lbl("by_cookie"))
    a.call(Helper.GET_PRANDOM_U32).ja(g.lbl("slot"))
    a.label(g.lbl("by_cookie")).mov(R1, R6).call(Helper.GET_SOCKET_COOKIE)
    a.label(g.lbl("slot")).ldx(2, R2, R7, 4).mod(R0, R2).add(R0, 1).stx(2, R10, _KEY + alen + 2, R0)
    _lookup(a, g.m("services"), _KEY)
    a.jeq(R0, 0, miss).ldx(4, R9, R0, 0)
    a.stx(4, R10, _BKEY, R9)
    _lookup(a, g.m("backends"), _BKEY)
    a.jeq(R0, 0, miss).mov(R8, R0)
    # a newly chosen backend is remembered for affinity
    a.ldx(1, R2, R7, 8).jset(R2, _F_AFFINITY, g.lbl("aff_write")).ja(rev)
    a.label(g.lbl("aff_write"))
    a.call(Helper.KTIME_GET_NS).div(R0, _NSEC_PER_SEC).stx(8, R10, _AVAL, R0)
    a.stx(4, R10, _AVAL + 8, R9).st(4, R10, _AVAL + 12, 0)
    a.ld_map(R1, g.m("affinity")).mov(R2, R10).add(R2, _AKEY).mov(R3, R10).add(R3, _AVAL).mov(R4, 0)
    a.call(Helper.MAP_UPDATE_ELEM).ja(rev)
    a.label(have)
    a.stx(4, R10, _BKEY, R9)
    _lookup(a, g.m("backends"), _BKEY)
    a.jeq(R0, 0, miss).mov(R8, R0)
    a.label(rev)


def _forward(a: Asm, g: _Gen, miss: str) -> None:
    """One family's forward translation; falls to ``miss`` when there is nothing to do."""
    alen = g.alen
    _frontend_key(a, g)
    _lookup_service(a, g, miss)
    a.ldx(1, R2, R7, 8).jset(R2, _F_EXTERNAL_IP, "proceed")
    a.ldx(2, R2, R7, 4).jne(R2, 0, g.lbl("has_backends"))
    _refuse(a, errno.EHOSTUNREACH)
    a.label(g.lbl("has_backends"))
    _affinity(a, g)
    _select(a, g, "proceed")
    # the reverse entry: {cookie, backend addr, backend port} -> {frontend, rev_nat_index}
    a.ldx(2, R2, R7, 6).stx(2, R10, _RVAL + alen + 2, R2)
    a.mov(R1, R6).call(Helper.GET_SOCKET_COOKIE).stx(8, R10, _RKEY, R0)
    _copy(a, R10, _RKEY + 8, R8, 0, alen)
    a.ldx(2, R2, R8, alen).stx(2, R10, _RKEY + 8 + alen, R2).st(2, R10, _RKEY + 10 + alen, 0)
    a.ld_map(R1, g.m("reverse_sk")).mov(R2, R10).add(R2, _RKEY).mov(R3, R10).add(R3, _RVAL).mov(R4, 0)
    a.call(Helper.MAP_UPDATE_ELEM).jeq(R0, 0, g.lbl("rewrite"))
    _refuse(a, errno.ENOMEM)
    a.label(g.lbl("rewrite"))
    _write_address(a, g, R8, 0)
    a.ja("proceed")


def sock_forward(family: IPFamily, *, v4_in_v6: bool = False) -> Asm:
    """connect and sendmsg translation for ``family`` (the same code serves both hooks).

    ``v4_in_v6`` (IPv6 only): a destination ``::ffff:a.b.c.d`` with no IPv6 frontend is
    translated through the IPv4 maps (named ``services4``, ``backends4``, ``reverse_sk4``,
    ``affinity4``), as Cilium's ``sock6_xlate_v4_in_v6``.
    """
    a = Asm().mov(R6, R1)
    _forward(a, _gen(family), "v4in6" if v4_in_v6 and family is IPFamily.IPv6 else "proceed")
    if v4_in_v6 and family is IPFamily.IPv6:
        a.label("v4in6")
        _jump_unless_mapped(a, "proceed")
        _forward(a, _V4_IN_V6, "proceed")
    a.label("proceed").mov(R0, 1).exit()
    return a


def _reverse(a: Asm, g: _Gen, miss: str) -> None:
    alen = g.alen
    a.mov(R1, R6).call(Helper.GET_SOCKET_COOKIE).stx(8, R10, _RKEY, R0)
    _copy(a, R10, _RKEY + 8, R6, g.ip_off, alen)
    a.ldx(4, R2, R6, _USER_PORT).stx(2, R10, _RKEY + 8 + alen, R2).st(2, R10, _RKEY + 10 + alen, 0)
    _lookup(a, g.m("reverse_sk"), _RKEY)
    a.jeq(R0, 0, miss).mov(R8, R0)
    # the frontend must still be there with the same service id
    _copy(a, R10, _KEY, R8, 0, alen)
    a.ldx(2, R2, R8, alen).stx(2, R10, _KEY + alen, R2).st(2, R10, _KEY + alen + 2, 0)
    a.ldx(4, R2, R6, _PROTOCOL).stx(1, R10, _KEY + alen + 4, R2)
    a.st(1, R10, _KEY + alen + 5, 0).st(2, R10, _KEY + alen + 6, 0)
    stale = g.lbl("stale")
    _lookup_service(a, g, stale)
    a.ldx(2, R2, R7, 6).ldx(2, R3, R8, alen + 2).jne(R2, R3, stale)
    _write_address(a, g, R8, 0)
    a.ja("proceed")
    a.label(stale)
    a.ld_map(R1, g.m("reverse_sk")).mov(R2, R10).add(R2, _RKEY).call(Helper.MAP_DELETE_ELEM)
    a.ja("proceed")


def sock_reverse(family: IPFamily, *, v4_in_v6: bool = False) -> Asm:
    """recvmsg and getpeername translation for ``family`` (``v4_in_v6`` as :func:`sock_forward`)."""
    a = Asm().mov(R6, R1)
    _reverse(a, _gen(family), "v4in6" if v4_in_v6 and family is IPFamily.IPv6 else "proceed")
    if v4_in_v6 and family is IPFamily.IPv6:
        a.label("v4in6")
        _jump_unless_mapped(a, "proceed")
        _reverse(a, _V4_IN_V6, "proceed")
    a.label("proceed").mov(R0, 1).exit()
    return a


def sock_program(hook: AttachType, *, v4_in_v6: bool = False) -> Asm:
    """The program for one cgroup hook (connect4 ... getpeername6); ``v4_in_v6`` adds the
    IPv4-in-IPv6 fallback to the IPv6 hooks (their maps then include the IPv4 ones).

    Raises:
        KeyError: ``hook`` is not a socket-LB hook.
    """
    for family in (IPFamily.IPv4, IPFamily.IPv6):
        if hook in FORWARD_HOOKS[family]:
            return sock_forward(family, v4_in_v6=v4_in_v6)
        if hook in REVERSE_HOOKS[family]:
            return sock_reverse(family, v4_in_v6=v4_in_v6)
    raise KeyError(f"{hook!r} is not a socket-LB hook")
