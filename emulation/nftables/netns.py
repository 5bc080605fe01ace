"""One node's nftables state, and packets sent through it: :class:`Netns`.

Theory of operation. Every base chain of every table whose family fits the packet (``ip`` or
``inet`` for IPv4, ``ip6`` or ``inet`` for IPv6) is registered at its hook with its priority;
at a hook they run in numeric priority order (``nf_hook_entries``: a kube-proxy table beside a
CNI's ``inet`` table or an iptables-nft table on the same hook interleaves by priority), with
conntrack at -200 (``NF_IP_PRI_CONNTRACK``) at prerouting and output. A packet that a chain
drops or rejects goes no further. ``nat`` chains run for a flow's first packet only
(``nf_nat_inet_fn``); the first that decides a mapping for its end (destination at prerouting
and output, source at postrouting and input) wins, and later packets of the flow get the
conntrack entry's translation. Routing, the address ``masquerade`` picks and the source port
NAT chooses are ``emulation.node`` and ``emulation.netfilter.nat``, as the iptables model's.

:meth:`Netns.send` samples (``numgen random`` from the caller's ``random.Random``) and commits
counters, dynamic set updates and conntrack; :meth:`Netns.enumerate` lists every outcome with
its probability (``numgen random mod N`` branches N ways, 1/N each) and changes nothing.
A ``reject`` is reported as the verdict ``REJECT``, its reason naming the answer the kernel
sends (:func:`reject_answer`); the answer itself is not sent through the model.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from emulation.addr import parse_address
from emulation.clock import Clock
from emulation.conntrack import ConntrackEntry, ConntrackTable, FlowKey, timeout_s
from emulation.netfilter.nat import source_port
from emulation.netfilter.outcome import Outcome, delivered
from emulation.netfilter.verdicts import CtState, Delivery, Verdict
from emulation.nftables import exprs as ex
from emulation.nftables.evaluate import Flow, run_base_chain
from emulation.nftables.listing import CounterKey, list_ruleset
from emulation.nftables.model import (
    Chain,
    ChainType,
    Element,
    Family,
    NftHook,
    Rule,
    Ruleset,
    Table,
    TableSet,
)
from emulation.nftables.ruleset import apply
from emulation.nftables.types import Key
from emulation.node import Node
from emulation.packet import Packet

__all__ = ["CONNTRACK_PRIORITY", "Netns", "reject_answer"]

#: ``NF_IP_PRI_CONNTRACK``.
CONNTRACK_PRIORITY = -200
_ROUTABLE = ("local", "unicast", "broadcast", "multicast")
_SRC_HOOKS = (NftHook.POSTROUTING, NftHook.INPUT)
_CT = ex.CT_STATES
_STATES = {_CT["new"]: CtState.NEW, _CT["established"]: CtState.ESTABLISHED, _CT["invalid"]: CtState.INVALID}
_Stage = tuple[int, int, Table | None, Chain | None]


#: ``icmpx`` codes (``NFT_REJECT_ICMPX_*``) as each family answers them (``nft_reject_icmp_code``,
#: ``nft_reject_icmpv6_code``).
_ICMPX = {
    "port-unreachable": ("icmp port-unreachable", "icmpv6 port-unreachable"),
    "admin-prohibited": ("icmp admin-prohibited", "icmpv6 admin-prohibited"),
    "host-unreachable": ("icmp host-unreachable", "icmpv6 addr-unreachable"),
    "no-route": ("icmp net-unreachable", "icmpv6 no-route"),
}


def reject_answer(with_: str, version: int, proto: str) -> str:
    """What the kernel answers a packet rejected by ``reject [with WITH]`` (``with_`` is the text
    after ``with``, or ``"default"``), as ``nft_reject_inet_eval`` and ``nft_reject_ipv4_eval``:
    a plain ``reject`` sends ICMP (ICMPv6) port unreachable, for TCP too; ``tcp reset`` a TCP
    reset; ``icmpx CODE`` the family's own code; ``icmp``/``icmpv6 CODE`` that code."""
    if with_ == "default":
        with_ = "icmpx port-unreachable"
    if with_ == "tcp reset":
        return "tcp reset" if proto == "tcp" else "nothing (tcp reset of a non-TCP packet)"
    kind, _, code = with_.partition(" ")
    if kind == "icmpx":
        pair = _ICMPX.get(code, (f"icmp {code}", f"icmpv6 {code}"))
        return pair[0] if version == 4 else pair[1]
    return with_


class _Path:
    """One evaluation of one packet (internal)."""

    def __init__(self, ns: Netns, flow: Flow, packet: Packet) -> None:
        self.ns, self.flow, self.packet = ns, flow, packet
        self.orig_src, self.orig_dst = flow.src, flow.dst
        self.entry: ConntrackEntry | None = None
        self.is_reply = False
        self.new_flow = False
        self.orig: FlowKey | None = None
        self.nat_done: set[str] = set()
        self.pending_src: tuple[int, int] = (flow.src, flow.sport)  # an existing flow's source

    def run(self) -> tuple[Outcome, Callable[[], None] | None]:
        flow, node = self.flow, self.ns.node
        if self.packet.in_interface is None:
            route = node.route(flow.version, flow.dst)
            if route.kind not in _ROUTABLE:
                return self.done(Verdict.DROP, Delivery.NONE, None, f"route: {route.kind}")
            flow.oif = route.device
            v = self.hook(NftHook.OUTPUT)
            if v is not None:
                return v
            route = node.route(flow.version, flow.dst)
            flow.oif = route.device
            v = self.hook(NftHook.POSTROUTING)
            if v is not None:
                return v
            if route.kind != "local":
                return self.snat_then(Delivery.FORWARD, route.device, route.nexthop)
            self.bind_source(None, None)
            flow.iif, flow.oif = "lo", None
            for hook in (NftHook.PREROUTING, NftHook.INPUT):
                v = self.hook(hook, looped=True)
                if v is not None:
                    return v
            return self.done(Verdict.ACCEPT, Delivery.LOCAL, None, "delivered locally")
        v = self.hook(NftHook.PREROUTING)
        if v is not None:
            return v
        route = node.route(flow.version, flow.dst)
        if route.kind in ("local", "broadcast", "multicast"):
            v = self.hook(NftHook.INPUT)
            if v is not None:
                return v
            return self.snat_then(Delivery.LOCAL, None, None)
        if route.kind != "unicast" or not node.ip_forward:
            return self.done(
                Verdict.DROP, Delivery.NONE, None, f"route: {route.kind}, ip_forward={node.ip_forward}"
            )
        flow.oif = route.device
        for hook in (NftHook.FORWARD, NftHook.POSTROUTING):
            v = self.hook(hook)
            if v is not None:
                return v
        return self.snat_then(Delivery.FORWARD, route.device, route.nexthop)

    def snat_then(
        self, delivery: Delivery, device: str | None, nexthop: str | None
    ) -> tuple[Outcome, Callable[[], None] | None]:
        why = self.bind_source(device, nexthop)
        if why is not None:
            return self.done(Verdict.DROP, Delivery.NONE, None, why)
        reason = "delivered locally" if delivery == Delivery.LOCAL else f"sent out {device}"
        return self.done(Verdict.ACCEPT, delivery, device, reason)

    def hook(
        self, hook: NftHook, *, looped: bool = False
    ) -> tuple[Outcome, Callable[[], None] | None] | None:
        """Run a hook's stages; an outcome when the packet is dropped or rejected there."""
        flow = self.flow
        flow.hook = hook.value.upper()
        for _, _, table, chain in self.ns.stages(hook, flow.version):
            if table is None or chain is None:
                if not looped:
                    self.conntrack_in()
                continue
            if chain.type == ChainType.NAT:
                end = "src" if hook in _SRC_HOOKS else "dst"
                if looped or not self.new_flow or end in self.nat_done:
                    continue
                verdict = run_base_chain(flow, table, chain)
                if end == "dst" and flow.dnat is not None:
                    addr, port = flow.dnat
                    flow.dst = flow.dst if addr == -1 else addr
                    flow.dport = flow.dport if port is None else port
                    flow.ct_status |= ex.CT_STATUS["dnat"]
                    self.nat_done.add(end)
                elif end == "src" and flow.snat is not None:
                    self.nat_done.add(end)
            else:
                verdict = run_base_chain(flow, table, chain)
            if verdict != "accept":
                where = f"{table.family} {table.name} {chain.name}"
                if flow.reject is None:
                    return self.done(Verdict.DROP, Delivery.NONE, None, where)
                answer = reject_answer(flow.reject, flow.version, flow.proto)
                return self.done(Verdict.REJECT, Delivery.NONE, None, f"{where}: answered with {answer}")
        return None

    def conntrack_in(self) -> None:
        flow = self.flow
        if flow.notrack:
            flow.ctstate = _CT["untracked"]
            return
        key: FlowKey = (flow.version, flow.src, flow.sport, flow.dst, flow.dport, flow.proto)
        found = self.ns.conntrack.lookup(key)
        if found is None:
            self.new_flow, self.orig = True, key
            flow.ctstate = _CT["new"]
            return
        entry, is_reply = found
        self.entry, self.is_reply = entry, is_reply
        flow.ctmark = entry.mark
        flow.ct_status = (ex.CT_STATUS["dnat"] if entry.dnat else 0) | (
            ex.CT_STATUS["snat"] if entry.snat else 0
        )
        flow.ctstate = _CT["established"] if is_reply or entry.seen_reply else _CT["new"]
        o, r = entry.original, entry.reply
        if is_reply:
            flow.dst, flow.dport = o[1], o[2]
            self.pending_src = (o[3], o[4])
        else:
            flow.dst, flow.dport = r[1], r[2]
            self.pending_src = (r[3], r[4])

    def bind_source(self, device: str | None, nexthop: str | None) -> str | None:
        flow = self.flow
        if self.entry is not None:
            flow.src, flow.sport = self.pending_src
            return None
        if not self.new_flow:
            return None
        addr: int | None = None
        rand_all = False
        if flow.snat is not None:
            addr, rand_all = flow.snat
            if addr == -1:
                text = self.ns.node.source_address(device or "lo", flow.version, nexthop, flow.dst)
                if text is None:
                    return f"masquerade: no address on {device or 'the way in'}"
                addr = parse_address(text)[1]
        table, v, f = self.ns.conntrack, flow.version, flow
        port, free = source_port(
            table, v, f.proto, f.src, f.sport, f.dst, f.dport, (addr, None, None, rand_all), self.ns.rand
        )
        if addr is not None and (addr, port) != (flow.src, flow.sport):
            flow.ct_status |= ex.CT_STATUS["snat"]
        flow.src, flow.sport = (flow.src if addr is None else addr), port
        return None if free else "no free source port"

    def done(
        self, verdict: Verdict, delivery: Delivery, device: str | None, reason: str
    ) -> tuple[Outcome, Callable[[], None] | None]:
        flow, p = self.flow, self.packet
        final = delivered(
            p,
            flow.version,
            self.orig_src,
            self.orig_dst,
            flow.src,
            flow.dst,
            flow.sport,
            flow.dport,
            flow.mark,
            device,
        )
        outcome = Outcome(
            verdict=verdict,
            delivery=delivery,
            out_interface=device,
            packet=final,
            ctstate=CtState.UNTRACKED if flow.notrack else _STATES.get(flow.ctstate, CtState.NEW),
            dnat=(flow.dst, flow.dport) != (self.orig_dst, p.dport) and not self.is_reply,
            snat=(flow.src, flow.sport) != (self.orig_src, p.sport) and not self.is_reply,
            masquerade=flow.masquerade,
            reason=reason,
            uncertain=flow.uncertain,
            trace=tuple(flow.trace),
        )
        return outcome, self.commit_fn(verdict)

    def commit_fn(self, verdict: Verdict) -> Callable[[], None] | None:
        flow, ct = self.flow, self.ns.conntrack
        if self.new_flow and self.orig is not None and verdict == Verdict.ACCEPT:
            now = flow.now
            reply: FlowKey = (flow.version, flow.dst, flow.dport, flow.src, flow.sport, flow.proto)
            new = ConntrackEntry(
                original=self.orig,
                reply=reply,
                created_s=now,
                expires_s=now + timeout_s(flow.proto, False, 0.0),
                mark=flow.ctmark,
            )
            return lambda: ct.confirm(new)
        if self.entry is not None:
            entry, is_reply, mark = self.entry, self.is_reply, flow.ctmark

            def refresh() -> None:
                ct.refresh(entry, reply=is_reply, mark=mark)

            return refresh
        return None


def _rules(rs: Ruleset) -> dict[CounterKey, Rule]:
    return {
        (t.family, t.name, r.handle): r
        for t in rs.tables.values()
        for c in t.chains.values()
        for r in c.rules
    }


def _elements(rs: Ruleset) -> dict[tuple[Family, str, str, tuple[Key, ...]], Element]:
    return {
        (t.family, t.name, s.name, e.key): e
        for t in rs.tables.values()
        for s in t.sets.values()
        if s.counter
        for e in s.elements
    }


class Netns:
    """One node's nftables ruleset, rule counters, dynamic set elements and conntrack table.

    Args:
        node: addresses, interfaces, routes and sysctls.
        clock: seconds, for conntrack and set timeouts.
        ruleset: the initial ruleset (default: empty, everything accepted).
    """

    def __init__(self, node: Node, clock: Clock, *, ruleset: Ruleset | None = None) -> None:
        self.node = node
        self.clock = clock
        self.ruleset = ruleset or Ruleset()
        self.conntrack = ConntrackTable(clock)
        #: Packets and bytes counted by each rule's ``counter``, by (family, table, handle).
        self.counted: dict[CounterKey, tuple[int, int]] = {}
        #: Packets and bytes counted per element of sets with ``counter``.
        self.element_counted: dict[tuple[Family, str, str, tuple[Key, ...]], tuple[int, int]] = {}
        #: Elements added from the packet path (``update @set``), with their expiry time.
        self.dynamic: dict[tuple[Family, str, str], dict[tuple[Key, ...], float]] = {}
        self.rand: Callable[[], float] | None = None
        self._stages: tuple[Ruleset, dict[tuple[NftHook, int], list[_Stage]]] | None = None
        self._indexes: tuple[Ruleset, dict[int, dict[tuple[Key, ...], Element]]] | None = None

    def index(self, s: TableSet) -> dict[tuple[Key, ...], Element]:
        """The elements of a set of the current ruleset by key (built once per ruleset), so a
        lookup costs the same whatever the number of elements, as the kernel's hash sets."""
        if self._indexes is None or self._indexes[0] is not self.ruleset:
            self._indexes = (self.ruleset, {})
        found = self._indexes[1].get(id(s))
        if found is None:
            found = self._indexes[1][id(s)] = {e.key: e for e in s.elements}
        return found

    def apply(self, text: str, *, strict: bool = True) -> None:
        """``nft -f``: atomic; on :class:`~.model.NftablesError` nothing changes. Counters of
        rules that stay are kept, as the kernel keeps them; those of rules gone (deleted,
        flushed, or in a table deleted and made again, whose handles start over) are dropped."""
        old = self.ruleset
        new = apply(old, text, strict=strict)
        kept = {key: rule for key, rule in _rules(new).items() if _rules(old).get(key) is rule}
        self.counted = {k: v for k, v in self.counted.items() if k in kept}
        old_elems, new_elems = _elements(old), _elements(new)
        self.element_counted = {
            k: v
            for k, v in self.element_counted.items()
            if k in new_elems and new_elems[k] is old_elems.get(k)
        }
        self.ruleset = new

    def counters(self) -> dict[CounterKey, ex.Counter]:
        """Every rule counter's current value: its starting value plus what was counted."""
        out: dict[CounterKey, ex.Counter] = {}
        for table in self.ruleset.tables.values():
            for chain in table.chains.values():
                for rule in chain.rules:
                    for st in rule.stmts:
                        if isinstance(st, ex.Counter):
                            p, b = self.counted.get((table.family, table.name, rule.handle), (0, 0))
                            out[(table.family, table.name, rule.handle)] = ex.Counter(
                                st.packets + p, st.bytes + b
                            )
        return out

    def list_ruleset(self) -> str:
        """``nft list ruleset`` with live counters."""
        return list_ruleset(self.ruleset, counters=self.counters(), element_counters=self.element_counted)

    def stages(self, hook: NftHook, version: int) -> list[_Stage]:
        """The base chains at ``hook`` for an IPv``version`` packet, in priority order, and the
        conntrack stage as ``(priority, order, None, None)``."""
        if self._stages is None or self._stages[0] is not self.ruleset:
            self._stages = (self.ruleset, {})
        cache = self._stages[1]
        found = cache.get((hook, version))
        if found is None:
            fams = (Family.IP, Family.INET) if version == 4 else (Family.IP6, Family.INET)
            found = []
            order = 0
            if hook in (NftHook.PREROUTING, NftHook.OUTPUT):
                found.append((CONNTRACK_PRIORITY, -1, None, None))
            for table in self.ruleset.tables.values():
                if table.family not in fams:
                    continue
                for chain in table.chains.values():
                    if chain.hook == hook:
                        found.append((chain.priority, order, table, chain))
                        order += 1
            found.sort(key=lambda s: (s[0], s[1]))
            cache[(hook, version)] = found
        return found

    def _evaluate(
        self, packet: Packet, choose: Callable[[int], int], tracing: bool
    ) -> tuple[Outcome, Flow, Callable[[], None] | None]:
        version, src = parse_address(packet.src)
        _, dst = parse_address(packet.dst)
        if packet.in_interface is not None and self.node.interface(packet.in_interface) is None:
            raise ValueError(f"in_interface={packet.in_interface!r} is not an interface of the node")
        flow = Flow(
            node=self.node,
            version=version,
            src=src,
            dst=dst,
            sport=packet.sport,
            dport=packet.dport,
            proto=packet.protocol,
            iif=packet.in_interface,
            mark=packet.mark,
            length=packet.length,
            now=self.clock.now(),
            choose=choose,
            index=self.index,
            dyn_sets=self.dynamic,
            tracing=tracing,
        )
        outcome, commit = _Path(self, flow, packet).run()
        return outcome, flow, commit

    def send(self, packet: Packet, rng: random.Random, *, trace: bool = False) -> Outcome:
        """Evaluate one packet, drawing ``numgen random`` from ``rng``, and commit its effects
        (rule counters, ``update @set`` elements, conntrack).

        Raises:
            ValueError: ``in_interface`` is not one of the node's, or a jump loop.
        """
        self.rand = rng.random
        try:
            outcome, flow, commit = self._evaluate(packet, lambda n: int(rng.random() * n), trace)
        finally:
            self.rand = None
        for key in flow.counted:
            p, b = self.counted.get(key, (0, 0))
            self.counted[key] = (p + 1, b + packet.length)
        for ekey in flow.elem_counted:
            p, b = self.element_counted.get(ekey, (0, 0))
            self.element_counted[ekey] = (p + 1, b + packet.length)
        for name, k, expires in flow.dyn_updates:
            self.dynamic.setdefault(name, {})[k] = expires
        if commit is not None:
            commit()
        return outcome

    def enumerate(self, packet: Packet, *, trace: bool = False) -> list[tuple[float, Outcome]]:
        """Every outcome of ``packet`` with its probability (summing to 1); nothing changes.

        Each ``numgen random mod N`` met branches into its N values, 1/N each.
        """
        results: list[tuple[float, Outcome]] = []
        pending: list[list[int]] = [[]]
        while pending:
            prefix = pending.pop()
            taken: list[tuple[int, int]] = []

            def choose(n: int, prefix: list[int] = prefix, taken: list[tuple[int, int]] = taken) -> int:
                k = len(taken)
                pick = prefix[k] if k < len(prefix) else 0
                taken.append((n, pick))
                return pick

            outcome, _, _ = self._evaluate(packet, choose, trace)
            prob = 1.0
            for n, _pick in taken:
                prob /= n
            results.append((prob, outcome))
            for k in range(len(prefix), len(taken)):
                n = taken[k][0]
                for alt in range(1, n):
                    pending.append([t[1] for t in taken[:k]] + [alt])
        return results
