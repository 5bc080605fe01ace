"""The socket-LB programs on the BPF machine: Cilium's bpf_sock.c behaviour over layout.py's maps."""

from __future__ import annotations

import errno
import ipaddress
from fractions import Fraction

from emulation.bpf import AttachType, SockAddr
from kproxy.kernel.bpf import EmulatedBpf
from kproxy.model import IPFamily
from kproxy.modes.ebpf.datapath import SockLB, sock_program
from kproxy.modes.ebpf.layout import AffinityMatchKey, ServiceFlag, ServiceFlag2, SockRevNatKey
from tests.bpf_services import Svc, put, remove

CONNECT4, SENDMSG4 = AttachType.CGROUP_INET4_CONNECT, AttachType.CGROUP_UDP4_SENDMSG
PEER4, CONNECT6 = AttachType.CGROUP_INET4_GETPEERNAME, AttachType.CGROUP_INET6_CONNECT
WEB = Svc(vip="10.96.0.10", port=80, rev_nat_index=1,
          backends=((4, "10.244.1.5", 8080), (5, "10.244.1.6", 8080), (6, "10.244.2.7", 8080)))


class Node:
    """An emulated kernel with the socket-LB programs linked at ``/cg`` and a settable clock."""

    def __init__(self, *services: Svc) -> None:
        self.now_ns = 0
        self.k = EmulatedBpf(clock_ns=lambda: self.now_ns)
        self.lb = SockLB.load(self.k, max_entries=256)
        self.lb.attach("/cg")
        for svc in services:
            put(self.k, self.lb, svc)

    def hook(self, attach: AttachType, ip: str, port: int, *, proto: int = 6, cookie: int = 1,
             netns: int = 7) -> tuple[int, SockAddr, int | None]:
        res = self.k.run_sock_addr("/cg", SockAddr(attach=attach, user_ip=ip, user_port=port,
                                                   protocol=proto, socket_cookie=cookie,
                                                   netns_cookie=netns))
        assert res is not None and isinstance(res.ctx, SockAddr)
        return res.ret32, res.ctx, res.retval


def test_connect_spreads_over_count_slots_with_equal_probability() -> None:
    """connect4 to a ClusterIP picks slot prandom % 3 + 1: each backend with probability ~1/3."""
    node = Node(WEB)
    outs = node.k.machine().enumerate(sock_program(CONNECT4).assemble(
        {name: node.lb.fd(IPFamily.IPv4, name) for name in
         ("services", "backends", "reverse_sk", "affinity", "affinity_match")}),
        SockAddr(attach=CONNECT4, user_ip=WEB.vip, user_port=80))
    spread = {(o.ctx.user_ip, o.ctx.user_port): o.probability for o in outs if isinstance(o.ctx, SockAddr)}
    assert set(spread) == {(ip, port) for _, ip, port in WEB.backends}
    assert all(abs(p - Fraction(1, 3)) < Fraction(1, 1 << 30) for p in spread.values())


def test_getpeername_shows_the_service_after_a_translated_connect() -> None:
    """The reverse entry written at connect turns the backend peer back into the Service."""
    node = Node(WEB)
    ret, ctx, _ = node.hook(CONNECT4, WEB.vip, 80, cookie=11)
    assert ret == 1 and ctx.user_ip.startswith("10.244.")
    _, peer, _ = node.hook(PEER4, ctx.user_ip, ctx.user_port, cookie=11)
    assert (peer.user_ip, peer.user_port) == (WEB.vip, 80)
    _, other, _ = node.hook(PEER4, ctx.user_ip, ctx.user_port, cookie=12)  # another socket
    assert (other.user_ip, other.user_port) == (ctx.user_ip, ctx.user_port)


def test_a_service_without_backends_refuses_the_connect_with_ehostunreach() -> None:
    """count 0: SYS_REJECT with bpf_set_retval(-EHOSTUNREACH), as Cilium."""
    node = Node(Svc(vip="10.96.0.20", port=80, rev_nat_index=2))
    ret, ctx, retval = node.hook(CONNECT4, "10.96.0.20", 80)
    assert (ret, retval, ctx.user_ip) == (0, -errno.EHOSTUNREACH, "10.96.0.20")


def test_unknown_destinations_and_external_ips_are_not_translated() -> None:
    """No frontend, or an ExternalIP Service: the destination stays (Cilium's MITM guard)."""
    node = Node(WEB, Svc(vip="203.0.113.9", port=80, rev_nat_index=3, flags=ServiceFlag.EXTERNAL_IP,
                         backends=((9, "10.244.1.9", 80),)))
    for ip, port in (("10.96.0.10", 81), ("10.96.0.99", 80), ("203.0.113.9", 80)):
        ret, ctx, _ = node.hook(CONNECT4, ip, port)
        assert (ret, ctx.user_ip, ctx.user_port) == (1, ip, port)


def test_loopback_nodeport_uses_the_wildcard_surrogate() -> None:
    """127.0.0.1:30080 finds the 0.0.0.0:30080 NodePort surrogate; a non-NodePort one is ignored."""
    np = Svc(vip="0.0.0.0", port=30080, rev_nat_index=4, flags=ServiceFlag.NODEPORT,
             backends=((7, "10.244.3.3", 8080),))
    plain = Svc(vip="0.0.0.0", port=30081, rev_nat_index=5, backends=((8, "10.244.3.4", 8080),))
    node = Node(np, plain)
    assert node.hook(CONNECT4, "127.0.0.1", 30080)[1].user_ip == "10.244.3.3"
    assert node.hook(CONNECT4, "127.0.0.1", 30081)[1].user_ip == "127.0.0.1"
    assert node.hook(CONNECT4, "10.0.0.1", 30080)[1].user_ip == "10.0.0.1"  # not loopback


def test_two_scope_services_use_the_internal_backends_east_west() -> None:
    """With TWO_SCOPES the INT-scope entry decides for socket-LB."""
    ext = Svc(vip="10.96.0.30", port=80, rev_nat_index=6, flags2=ServiceFlag2.TWO_SCOPES,
              backends=((10, "10.244.9.1", 80),))
    internal = Svc(vip="10.96.0.30", port=80, rev_nat_index=6, flags2=ServiceFlag2.TWO_SCOPES,
                   backends=((11, "10.244.9.2", 80),), scope=1)
    node = Node(ext, internal)
    assert node.hook(CONNECT4, "10.96.0.30", 80)[1].user_ip == "10.244.9.2"


def test_affinity_holds_per_netns_then_expires() -> None:
    """ClientIP affinity: the same netns gets the same backend until the timeout passes."""
    svc = Svc(vip="10.96.0.40", port=80, rev_nat_index=7, flags=ServiceFlag.AFFINITY,
              affinity_timeout_s=10, backends=tuple((20 + i, f"10.244.4.{i}", 80) for i in range(1, 9)))
    node = Node(svc)
    first = node.hook(CONNECT4, svc.vip, 80)[1].user_ip
    for t in range(1, 10):
        node.now_ns = t * 1_000_000_000
        assert node.hook(CONNECT4, svc.vip, 80)[1].user_ip == first
    picks = set()
    for t in range(30, 400, 20):  # each step is past the timeout: a fresh random pick
        node.now_ns = t * 1_000_000_000
        picks.add(node.hook(CONNECT4, svc.vip, 80, netns=7)[1].user_ip)
    assert len(picks) > 1


def test_affinity_to_a_backend_no_longer_matching_is_dropped() -> None:
    """A backend removed from the affinity-match map is not reused."""
    one = Svc(vip="10.96.0.41", port=80, rev_nat_index=8, flags=ServiceFlag.AFFINITY,
              affinity_timeout_s=100, backends=((30, "10.244.5.1", 80),))
    node = Node(one)
    assert node.hook(CONNECT4, one.vip, 80)[1].user_ip == "10.244.5.1"
    moved = Svc(vip=one.vip, port=80, rev_nat_index=8, flags=ServiceFlag.AFFINITY,
                affinity_timeout_s=100, backends=((31, "10.244.5.2", 80),))
    node.k.delete(node.lb.fd(IPFamily.IPv4, "affinity_match"),
                  AffinityMatchKey(backend_id=30, rev_nat_id=8).pack())
    put(node.k, node.lb, moved)
    assert node.hook(CONNECT4, one.vip, 80)[1].user_ip == "10.244.5.2"


def test_udp_sendmsg_picks_by_socket_cookie() -> None:
    """Unconnected UDP chooses slot cookie % count + 1, stable per socket."""
    dns = Svc(vip="10.96.0.53", port=53, rev_nat_index=9, proto=17,
              backends=((40, "10.244.6.1", 53), (41, "10.244.6.2", 53)))
    node = Node(dns)
    got = [node.hook(SENDMSG4, dns.vip, 53, proto=17, cookie=c)[1].user_ip for c in (2, 3, 4)]
    assert got == ["10.244.6.1", "10.244.6.2", "10.244.6.1"]


def test_a_stale_reverse_entry_is_deleted_when_the_service_is_gone() -> None:
    """getpeername after the Service vanished shows the backend and drops the entry."""
    node = Node(WEB)
    _, ctx, _ = node.hook(CONNECT4, WEB.vip, 80, cookie=5)
    rev = node.lb.fd(IPFamily.IPv4, "reverse_sk")
    key = SockRevNatKey(cookie=5, address=ctx.user_ip, port=ctx.user_port).pack()
    assert node.k.lookup(rev, key) is not None
    remove(node.k, node.lb, WEB)
    _, peer, _ = node.hook(PEER4, ctx.user_ip, ctx.user_port, cookie=5)
    assert peer.user_ip == ctx.user_ip and node.k.lookup(rev, key) is None


def test_connect6_translates_an_ipv6_service() -> None:
    """The IPv6 twin: fd00::10 port 80 goes to its backend."""
    node = Node(Svc(vip="fd00::10", port=80, rev_nat_index=10, backends=((50, "fd00:244::5", 8080),)))
    ret, ctx, _ = node.hook(CONNECT6, "fd00::10", 80)
    assert (ret, ctx.user_ip, ctx.user_port) == (1, "fd00:244::5", 8080)


def test_connect6_to_an_ipv4_mapped_service_goes_through_the_ipv4_maps() -> None:
    """::ffff:10.96.0.10 has no IPv6 frontend: the IPv4 one translates it to ::ffff:backend, and
    getpeername6 shows ::ffff:10.96.0.10 again (Cilium's sock6_xlate_v4_in_v6)."""
    node = Node(WEB)
    ret, ctx, _ = node.hook(CONNECT6, "::ffff:10.96.0.10", 80, cookie=21)
    mapped = ipaddress.IPv6Address(ctx.user_ip).ipv4_mapped
    assert ret == 1 and str(mapped) in {ip for _, ip, _ in WEB.backends} and ctx.user_port == 8080
    _, peer, _ = node.hook(AttachType.CGROUP_INET6_GETPEERNAME, ctx.user_ip, 8080, cookie=21)
    assert (str(ipaddress.IPv6Address(peer.user_ip).ipv4_mapped), peer.user_port) == (WEB.vip, 80)
    ret, other, _ = node.hook(CONNECT6, "::ffff:10.96.0.99", 80)
    assert (ret, ipaddress.IPv6Address(other.user_ip).ipv4_mapped) == (1, ipaddress.IPv4Address("10.96.0.99"))
