"""An emulated node with netfilter, ipset and IPVS composed as the kernel composes them.

Theory of operation
-------------------
IPVS hooks netfilter (``net/netfilter/ipvs/ip_vs_core.c``, ``ip_vs_ops``): ``ip_vs_in`` runs at
LOCAL_IN with priority ``NF_IP_PRI_NAT_SRC - 1`` (after the mangle, filter and security INPUT
chains, for packets routed to a local address: ``kube-ipvs0``'s addresses are local) and at
LOCAL_OUT with priority ``NF_IP_PRI_NAT_DST + 2`` (after the raw, mangle and nat OUTPUT
chains, for packets the node sends). A packet IPVS takes is translated to the real server
(masquerading forwarding, ``ip_vs_nat_xmit``) and sent through ``NF_INET_LOCAL_OUT`` again
(``ip_vs_nat_send_or_cont``): its conntrack entry already has its NAT bindings for the
destination, so nat OUTPUT is not consulted again, but mangle, filter (kube-proxy's
``KUBE-IPVS-OUT-FILTER``) and security OUTPUT are, then routing and POSTROUTING (where
``KUBE-POSTROUTING`` masquerades marked packets and ``KUBE-LOOP-BACK`` hairpin ones).

The netfilter model (:class:`emulation.netfilter.Netns`) walks whole paths, so
:class:`IpvsNode` runs one packet as up to two walks over views of the same ruleset (the same
rule objects, so counters and ``recent``/``nth`` state are shared), each view keeping only some
built-in chains:

- arriving packet: the whole ruleset (up to delivery; the nat INPUT chain, which kube-proxy
  leaves empty, runs before IPVS here rather than after); generated packet: only raw, mangle
  and nat OUTPUT;
- IPVS (:meth:`emulation.ipvs.IpvsTable.process`) on the delivered packet;
- taken by IPVS: mangle/filter/security OUTPUT and mangle/nat POSTROUTING on the translated
  packet, as a packet the node sends — unless the real server is an address of the node itself,
  which ``ip_vs_nat_send_or_cont`` accepts for local delivery (no POSTROUTING), and which is
  dropped when it is a loopback address and the packet came from outside; a generated packet
  IPVS does not take finishes its ordinary path (filter/security OUTPUT, POSTROUTING, and
  ``lo``'s INPUT for a local address).

The IPVS step appears in each outcome's trace as a step of table ``ipvs``, chain ``LOCAL_IN``
or ``LOCAL_OUT``, whose target is IPVS's verdict. :meth:`IpvsNode.enumerate` changes nothing
(it works on a copy of the IPVS table); :meth:`IpvsNode.send` commits.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from emulation import Clock, Interface, Node, Packet
from emulation.ipset import IpsetTable
from emulation.ipvs import IpvsResult, IpvsTable, Sysctls
from emulation.netfilter import Delivery, Netns, Outcome, Ruleset, Table, TraceStep, Verdict

__all__ = ["DUMMY_DEVICE", "IpvsNode", "IpvsStep", "ipvs_step"]

#: kube-proxy's ``defaultDummyDevice``.
DUMMY_DEVICE = "kube-ipvs0"
_LOCAL_OUT_PRE = frozenset({("raw", "OUTPUT"), ("mangle", "OUTPUT"), ("nat", "OUTPUT")})
_XMIT = frozenset({("mangle", "OUTPUT"), ("filter", "OUTPUT"), ("security", "OUTPUT"),
                   ("mangle", "POSTROUTING"), ("nat", "POSTROUTING")})


def _view(ruleset: Ruleset, keep: Callable[[str, str], bool]) -> Ruleset:
    """``ruleset`` with only the built-in chains ``keep`` accepts (user chains all kept)."""
    tables = {
        tname: Table(tname, {c: ch for c, ch in t.chains.items() if not ch.builtin or keep(tname, c)})
        for tname, t in ruleset.tables.items()
    }
    return Ruleset(ruleset.version, tables)


@dataclass(frozen=True, slots=True, kw_only=True)
class IpvsStep:
    """What IPVS did with one packet, as reported in a trace.

    Attributes:
        hook: ``LOCAL_IN`` (arriving packet) or ``LOCAL_OUT`` (packet sent by the node).
        result: the table's answer.
        virtual_server: ``TCP 10.96.0.10:53`` style, or None when no service matched.
        real_server: ``ip:port`` chosen, or None.
    """

    hook: str
    result: IpvsResult
    virtual_server: str | None
    real_server: str | None


def ipvs_step(outcome: Outcome) -> TraceStep | None:
    """The IPVS step of an :class:`IpvsNode` outcome's trace, or None when IPVS did not see it."""
    return next((s for s in outcome.trace if s.table == "ipvs"), None)


def _hostport(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class IpvsNode:
    """One emulated node: netfilter rules, ipsets, an IPVS table and the ``kube-ipvs0`` device.

    Args:
        node: the node's interfaces and routes (``kube-ipvs0`` is added by :meth:`bind`).
        clock: the time for conntrack and the IPVS connection table.
        version: 4 or 6, the family of the ruleset.
        sysctls: IPVS settings (default: what kube-proxy sets, :meth:`Sysctls.kube_proxy`).

    Attributes:
        netns: the netfilter namespace (its ruleset is what ``iptables-save`` shows).
        ipsets: the sets (the netfilter ``-m set`` lookup).
        ipvs: the IPVS table.
        bound: the addresses on ``kube-ipvs0``.
    """

    def __init__(self, node: Node, clock: Clock, *, version: int = 4, sysctls: Sysctls | None = None) -> None:
        self.base_node = node
        self.clock = clock
        self.ipsets = IpsetTable()
        self.ipvs = IpvsTable(sysctls or Sysctls.kube_proxy())
        self.netns = Netns(node, clock, ruleset=Ruleset(version), set_lookup=self.ipsets.lookup)
        self.bound: tuple[str, ...] = ()
        self.steps: list[IpvsStep] = []
        """What IPVS did in the last :meth:`send` or :meth:`enumerate` call, in order."""
        self._views: dict[str, tuple[Ruleset, Node, Netns]] = {}
        self._rng = random.Random(0)  # for send() without one: one stream, not one per packet

    def bind(self, addresses: tuple[str, ...]) -> None:
        """Make ``addresses`` (and only them) the addresses of ``kube-ipvs0`` (host routes, ``/32``
        or ``/128``), as kube-proxy's ``EnsureAddressBind`` / ``UnbindAddress`` leave it."""
        ifaces = tuple(i for i in self.base_node.interfaces if i.name != DUMMY_DEVICE)
        cidrs = tuple(f"{a}/{128 if ':' in a else 32}" for a in addresses)
        dummy = (Interface(name=DUMMY_DEVICE, addresses=cidrs),) if cidrs else ()
        self.netns.node = replace(self.base_node, interfaces=(*ifaces, *dummy))
        self.bound = tuple(addresses)

    def _netns(self, kind: str) -> Netns:
        """A namespace sharing the main one's state, over a view of its ruleset."""
        main = self.netns
        cached = self._views.get(kind)
        if cached is not None and cached[0] is main.ruleset and cached[1] is main.node:
            return cached[2]
        if kind == "local-pre":
            rules = _view(main.ruleset, lambda t, c: (t, c) in _LOCAL_OUT_PRE)
        elif kind == "local-rest":
            rules = _view(main.ruleset, lambda t, c: (t, c) not in _LOCAL_OUT_PRE)
        else:
            rules = _view(main.ruleset, lambda t, c: (t, c) in _XMIT)
        ns = Netns(main.node, main.clock, ruleset=rules, set_lookup=main.set_lookup)
        ns.counters, ns.dynamic, ns.conntrack = main.counters, main.dynamic, main.conntrack
        self._views[kind] = (main.ruleset, main.node, ns)
        return ns

    # --- packets -------------------------------------------------------------------------------

    def send(self, packet: Packet, rng: random.Random | None = None, *, flags: str | None = None) -> Outcome:
        """Send one packet and commit everything it changes (counters, conntrack, IPVS state).

        Args:
            packet: the packet (``in_interface=None``: sent by the node).
            rng: draws for ``statistic`` matches and NAT port choices (default: the node's own
                generator, seeded 0 when the node was made; not a fresh one per packet, which
                would give every packet the same draws).
            flags: TCP flags for IPVS (``"S"``, ``"A"``, ``"FA"`` ...; default from ``packet.syn``).
        """
        gen = rng or self._rng
        self.steps = []
        local = packet.in_interface is None
        first = (self._netns("local-pre") if local else self.netns).send(packet, gen, trace=True)

        def walk(kind: str, pkt: Packet) -> list[tuple[float, Outcome]]:
            return [(1.0, self._netns(kind).send(pkt, gen, trace=True))]

        return self._continue(first, self.ipvs, flags, walk)[0][1]

    def enumerate(self, packet: Packet, *, trace: bool = True) -> list[tuple[float, Outcome]]:
        """Every outcome of ``packet`` with its probability; nothing changes (IPVS decides on a
        copy of its table, so the answer is what the next packet would get). Outcomes are
        always traced (``trace`` is accepted for :meth:`Netns.enumerate`'s signature)."""
        self.steps = []
        local = packet.in_interface is None
        firsts = (self._netns("local-pre") if local else self.netns).enumerate(packet, trace=True)

        def walk(kind: str, pkt: Packet) -> list[tuple[float, Outcome]]:
            return self._netns(kind).enumerate(pkt, trace=True)

        out: list[tuple[float, Outcome]] = []
        for p1, first in firsts:
            for p2, o in self._continue(first, copy.deepcopy(self.ipvs), None, walk):
                out.append((p1 * p2, o))
        return out

    def _continue(self, first: Outcome, table: IpvsTable, flags: str | None,
                  walk: Callable[[str, Packet], list[tuple[float, Outcome]]]) -> list[tuple[float, Outcome]]:
        """The rest of the path after the first walk (see the module docstring)."""
        local = first.packet.in_interface is None
        if first.verdict != "ACCEPT" or (not local and first.delivery != "local"):
            return [(1.0, first)]
        if local and first.delivery != "local":  # not to a local address: IPVS never sees it
            return [(p, _join(first, None, o)) for p, o in walk("local-rest", first.packet)]
        result = table.process(first.packet, self.clock.now(), flags=flags)
        hook = "LOCAL_OUT" if local else "LOCAL_IN"
        step = _step(hook, result)
        self.steps.append(IpvsStep(hook=hook, result=result,
                                   virtual_server=str(result.service) if result.service is not None else None,
                                   real_server=_hostport(*result.real) if result.real is not None else None))
        if result.verdict == "accept":
            if local:
                return [(p, _join(first, step, o)) for p, o in walk("local-rest", first.packet)]
            return [(1.0, replace(first, trace=(*first.trace, step)))]
        if result.verdict in ("drop", "reject"):
            verdict = Verdict.DROP if result.verdict == "drop" else Verdict.REJECT
            return [(1.0, replace(first, verdict=verdict, delivery=Delivery.NONE,
                                  reason=f"IPVS {hook}: {result.verdict}",
                                  trace=(*first.trace, step)))]
        assert result.real is not None
        ip, port = result.real
        if not local and self.netns.node.is_local_ip(ip):
            # At LOCAL_OUT a local real server needs nothing special: NF_ACCEPT lets the packet
            # finish its output path (POSTROUTING, then lo), the same walk as the "xmit" view.
            return [(1.0, _local_real_server(first, step, ip, port))]
        translated = replace(first.packet, dst=ip, dport=port, in_interface=None, out_interface=None)
        return [(p, _join(first, step, o, dnat=True)) for p, o in walk("xmit", translated)]


def _local_real_server(first: Outcome, step: TraceStep, ip: str, port: int) -> Outcome:
    """An arriving packet whose real server is on the node itself, as ``ip_vs_nat_xmit`` does it.

    Traffic from the outside world translated to a loopback address is dropped ("stopping DNAT
    to loopback address", ip_vs_xmit.c); otherwise ``ip_vs_nat_send_or_cont`` returns NF_ACCEPT
    for a local destination, so the packet is delivered here at LOCAL_IN, without LOCAL_OUT or
    POSTROUTING (no masquerade).
    """
    trace = (*first.trace, step)
    packet = replace(first.packet, dst=ip, dport=port)
    if _is_loopback(ip):
        return replace(first, verdict=Verdict.DROP, delivery=Delivery.NONE, packet=packet, trace=trace,
                       dnat=True,
                       reason="IPVS: stopping DNAT to loopback address (ip_vs_nat_xmit)")
    return replace(first, verdict=Verdict.ACCEPT, delivery=Delivery.LOCAL, out_interface=None, packet=packet,
                   trace=trace, dnat=True, reason="IPVS: real server on this node, delivered locally")


def _is_loopback(ip: str) -> bool:
    return ip == "::1" or ip.startswith("127.")


def _step(hook: str, result: IpvsResult) -> TraceStep:
    vs = str(result.service) if result.service is not None else "-"
    real = _hostport(*result.real) if result.real is not None else ""
    fresh = " (new connection)" if result.new_connection else " (existing connection)"
    what = {"forward": f"-> {real}{fresh}",
            "accept": "not an IPVS connection: to the local stack",
            "drop": "dropped", "reject": "no real server: ICMP port unreachable"}[result.verdict]
    text = f"{vs} {what}; " + " | ".join(t.removeprefix("IPVS: ") for t in result.trace)
    return TraceStep(hook=hook, table="ipvs", chain=hook, index=0, line=0, rule=text.rstrip("; "),
                     result="match", target=result.verdict.upper())


def _join(first: Outcome, step: TraceStep | None, second: Outcome, *, dnat: bool = False) -> Outcome:
    """The whole path: ``first``'s walk, the IPVS step, then ``second``'s walk."""
    steps = (*first.trace, *((step,) if step is not None else ()), *second.trace)
    return replace(second, dnat=dnat or first.dnat or second.dnat, snat=first.snat or second.snat,
                   masquerade=first.masquerade or second.masquerade,
                   uncertain=first.uncertain or second.uncertain, ctstate=first.ctstate, trace=steps,
                   packet=replace(second.packet, in_interface=first.packet.in_interface)
                   if second.packet.in_interface != first.packet.in_interface else second.packet)
