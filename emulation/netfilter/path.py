"""A packet's way through the hooks of a node, in the kernel's order, with conntrack and NAT.

Arriving on an interface: PREROUTING (raw, conntrack, mangle, nat: the first packet of a flow
only; later ones reuse its translation), the routing decision on the translated destination,
then either INPUT (mangle, filter, security, nat for SNAT) for a local destination, or FORWARD
(mangle, filter, security) and POSTROUTING (mangle, nat). Generated locally: route, OUTPUT
(raw, conntrack, mangle, nat, filter, security), re-route if the destination or mark changed,
POSTROUTING; a local destination then loops through ``lo`` (raw and mangle PREROUTING, then
INPUT; conntrack and nat are not consulted again). What runs at each hook, and in what order,
is :data:`emulation.netfilter.hooks.STAGES`; this module adds the routing decisions between
the hooks, conntrack and the NAT decisions.

A :class:`Path` is one evaluation of one packet over a :class:`Ctx`: the plain walk of every
chain by default, or the accelerator's walk (:mod:`emulation.netfilter.accel`) given as
``walk``. A :class:`PathObserver` (the flow cache's recorder) may watch it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from emulation.addr import parse_address
from emulation.conntrack import ConntrackEntry, ConntrackTable, FlowKey, timeout_s
from emulation.netfilter.context import Ctx
from emulation.netfilter.hooks import CONNTRACK, NAT, STAGES, Hook
from emulation.netfilter.nat import SourceRange, source_port
from emulation.netfilter.outcome import Outcome, delivered
from emulation.netfilter.rules import Ruleset
from emulation.netfilter.traverse import ChainWalk, WalkObserver, run_chain
from emulation.netfilter.verdicts import CtState, Delivery, Verdict
from emulation.node import Node
from emulation.packet import Packet

__all__ = ["TUPLE_TAKEN", "NodeState", "Path", "PathObserver", "Walked"]

#: Why a packet whose source mapping found no free reply tuple is dropped.
TUPLE_TAKEN = "NAT: no source port leaves a free reply tuple (conntrack confirmation fails)"

#: A walked packet's outcome, its context (what to count) and what to commit to conntrack.
Walked = tuple[Outcome, Ctx, "Callable[[], None] | None"]

_ROUTABLE = ("local", "unicast", "broadcast", "multicast")


class NodeState(Protocol):
    """What a path reads of the node it runs on (a :class:`~emulation.netfilter.Netns`)."""

    @property
    def node(self) -> Node: ...
    @property
    def ruleset(self) -> Ruleset: ...
    @property
    def conntrack(self) -> ConntrackTable: ...


class PathObserver(WalkObserver, Protocol):
    """What a path tells whoever watches it, besides what its walks tell (the flow recorder)."""

    def conntrack(self) -> None:
        """Conntrack looks the packet up."""

    def source_nat(self, device: str | None, nexthop: str | None, chosen: int | None) -> None:
        """A new flow gets its source mapping (``chosen``: the address MASQUERADE took)."""

    def entered(self, iif: str) -> None:
        """A packet of the node to itself loops back in over ``iif``."""

    def abandon(self) -> None:
        """This packet's end is its own, not its path's (no free source port)."""

    def end(self, verdict: Verdict, delivery: Delivery, device: str | None, reason: str) -> None:
        """The path ended with this outcome."""


def _loopback(version: int, value: int) -> bool:
    """In 127.0.0.0/8."""
    return version == 4 and value >> 24 == 127


def _martian_source4(src: int, dst: int) -> bool:
    """An IPv4 source input routing refuses (ip_route_input_slow): multicast or the limited
    broadcast; or 0.0.0.0/8, unless sent to the limited broadcast or from and to 0.0.0.0."""
    if src >> 28 == 0xE or src == 0xFFFFFFFF:
        return True
    return src >> 24 == 0 and dst != 0xFFFFFFFF and not (src == 0 and dst == 0)


class Path:
    """One evaluation of one packet (see the module docstring).

    Args:
        state: the node, its rules and its conntrack table.
        ctx: the packet's context, at its first hook.
        packet, src, dst: the packet and its addresses as numbers.
        walk: how chains are walked (``None``: the plain walk).
        observer: told what the path does (``None``: nobody).
        known_new: the caller found no conntrack entry for it already (no lookup is made).
    """

    def __init__(
        self,
        state: NodeState,
        ctx: Ctx,
        packet: Packet,
        src: int,
        dst: int,
        *,
        walk: ChainWalk | None = None,
        observer: PathObserver | None = None,
        known_new: bool = False,
    ) -> None:
        self.state = state
        self.orig_src, self.orig_dst = src, dst
        self.ctx = ctx
        self.packet = packet
        self.rs = state.ruleset
        self.walk = walk
        self.observer = observer
        self.known_new = known_new
        self.entry: ConntrackEntry | None = None
        self.new_flow = False
        self.orig: FlowKey | None = None
        self.pending_src: tuple[int, int] | None = None  # translation of an existing entry
        self.pending_dst: tuple[int, int] | None = None
        self.confirmed = False  # a new flow's entry was confirmed before the path ended
        self.routed = (ctx.dst, ctx.mark)  # what OUTPUT's routing decision was made on

    def run(self) -> Walked:
        """Walk the packet to its end: its outcome, its context and its conntrack commit."""
        ctx, node = self.ctx, self.state.node
        if self.packet.in_interface is None:
            return self._local_out()
        if (
            ctx.iif != "lo"
            and not node.route_localnet
            and (_loopback(ctx.version, ctx.src) or _loopback(ctx.version, ctx.dst))
        ):
            return self._drop("martian: 127.0.0.0/8 off lo without route_localnet")
        v, reason = self._hook(Hook.PREROUTING)
        if v != Verdict.ACCEPT:
            return self._done(v, Delivery.NONE, None, reason)
        route = node.route(ctx.version, ctx.dst)
        if ctx.iif != "lo" and not node.route_localnet and _loopback(ctx.version, ctx.dst):
            return self._drop("martian destination 127.0.0.0/8 after DNAT")
        if ctx.version == 4 and ctx.iif != "lo" and _martian_source4(ctx.src, ctx.dst):
            return self._drop("martian source (multicast, broadcast or 0.0.0.0/8)")
        if route.kind in ("local", "broadcast", "multicast"):
            return self._input()
        if route.kind != "unicast":
            return self._drop(f"route: {route.kind}")
        if not node.ip_forward:
            return self._drop("ip_forward is off")
        ctx.oif = route.device
        v, reason = self._hook(Hook.FORWARD)
        if v != Verdict.ACCEPT:
            return self._done(v, Delivery.NONE, None, reason)
        return self._postrouting(route.device, route.nexthop)

    def _local_out(self) -> Walked:
        ctx, node = self.ctx, self.state.node
        route = node.route(ctx.version, ctx.dst)
        if route.kind not in _ROUTABLE:
            return self._drop(f"route: {route.kind}")
        ctx.oif = route.device
        v, reason = self._hook(Hook.OUTPUT)
        if v != Verdict.ACCEPT:
            return self._done(v, Delivery.NONE, None, reason)
        if (ctx.dst, ctx.mark) != self.routed:
            route = node.route(ctx.version, ctx.dst)
            if route.kind not in _ROUTABLE:
                return self._drop(f"re-route: {route.kind}")
            ctx.oif = route.device
        if route.kind != "local" and not node.route_localnet and _loopback(ctx.version, ctx.src):
            return self._drop("martian: 127.0.0.0/8 source leaving lo without route_localnet")
        if route.kind != "local":
            return self._postrouting(route.device, route.nexthop)
        v, reason = self._hook(Hook.POSTROUTING)
        if v != Verdict.ACCEPT:
            return self._done(v, Delivery.NONE, None, reason)
        dropped = self.apply_snat("lo", None)
        if dropped is not None:
            return self._drop(dropped)
        self.confirmed = True  # confirmed at POSTROUTING, before the loop back (see _done)
        ctx.iif, ctx.oif = "lo", None
        if self.observer is not None:
            self.observer.entered("lo")
        for hook in (Hook.PREROUTING, Hook.INPUT):
            v, reason = self._hook(hook, looped=True)
            if v != Verdict.ACCEPT:
                return self._done(v, Delivery.NONE, None, reason)
        return self._done(Verdict.ACCEPT, Delivery.LOCAL, None, "delivered locally")

    def _input(self) -> Walked:
        v, reason = self._hook(Hook.INPUT)
        if v != Verdict.ACCEPT:
            return self._done(v, Delivery.NONE, None, reason)
        dropped = self.apply_snat(None, None)
        if dropped is not None:
            return self._drop(dropped)
        return self._done(Verdict.ACCEPT, Delivery.LOCAL, None, "delivered locally")

    def _postrouting(self, device: str | None, nexthop: str | None) -> Walked:
        v, reason = self._hook(Hook.POSTROUTING)
        if v != Verdict.ACCEPT:
            return self._done(v, Delivery.NONE, None, reason)
        dropped = self.apply_snat(device, nexthop)
        if dropped is not None:
            return self._drop(dropped)
        return self._done(Verdict.ACCEPT, Delivery.FORWARD, device, f"sent out {device}")

    # --- hooks, conntrack, NAT --------------------------------------------------------------------

    def _hook(self, hook: Hook, *, looped: bool = False) -> tuple[Verdict, str]:
        """Run ``hook``'s stages in order: its verdict, and the reason when it is not ACCEPT
        (``raw HOOK`` when raw decided, else the hook's name). A packet looped back over ``lo``
        is not looked up by conntrack again, nor translated (its entry is confirmed)."""
        ctx = self.ctx
        ctx.hook = hook
        rs_tables = self.rs.tables
        for stage in STAGES[hook]:
            if stage == CONNTRACK:
                if not looped:
                    self.conntrack_in()
                    self.routed = (ctx.dst, ctx.mark)
                continue
            if stage == NAT and (looped or not self.new_flow):
                if not looped:
                    self._apply_existing(hook)
                continue
            table = rs_tables.get(stage)
            if table is None:
                continue
            chain = table.chains.get(hook)
            if chain is None:
                continue
            before = (ctx.dst, ctx.dport)
            v = run_chain(ctx, table, chain, self.walk)
            if stage == NAT and self.orig is not None and (ctx.dst, ctx.dport) != before:
                ctx.ct_dnat = True
                if ctx.ct_reply is not None:
                    ctx.ct_reply = (ctx.dst, ctx.dport, ctx.ct_reply[2], ctx.ct_reply[3])
            if v != Verdict.ACCEPT:
                return v, f"raw {hook}" if stage == "raw" and not looped else hook.value
        return Verdict.ACCEPT, ""

    def _apply_existing(self, hook: Hook) -> None:
        ctx = self.ctx
        if hook in (Hook.PREROUTING, Hook.OUTPUT) and self.pending_dst is not None:
            ctx.dst, ctx.dport = self.pending_dst
            self.pending_dst = None

    def conntrack_in(self) -> None:
        """The conntrack stage: find the packet's entry, or make a new flow's tuples."""
        ctx = self.ctx
        if self.observer is not None:
            self.observer.conntrack()
        if ctx.notrack:
            ctx.ctstate = CtState.UNTRACKED
            return
        key: FlowKey = (ctx.version, ctx.src, ctx.sport, ctx.dst, ctx.dport, ctx.proto)
        found = None if self.known_new else self.state.conntrack.lookup(key)
        if found is None:
            if ctx.proto == "tcp" and not ctx.syn and not self.state.node.tcp_loose:
                ctx.ctstate = CtState.INVALID
                return
            self.new_flow = True
            self.orig = key
            ctx.ctstate = CtState.NEW
            ctx.ct_orig = (ctx.src, ctx.sport, ctx.dst, ctx.dport)
            # The reply tuple exists from here on (init_conntrack: the inverse of the
            # original); NAT rewrites it when it decides (nf_conntrack_alter_reply).
            ctx.ct_reply = (ctx.dst, ctx.dport, ctx.src, ctx.sport)
            return
        entry, is_reply = found
        self.entry = entry
        ctx.ctmark = entry.mark
        ctx.ct_dnat, ctx.ct_snat = entry.dnat, entry.snat
        o, r = entry.original, entry.reply
        ctx.ct_orig = (o[1], o[2], o[3], o[4])
        ctx.ct_reply = (r[1], r[2], r[3], r[4])
        ctx.ct_dir_reply = is_reply
        if is_reply:
            ctx.ctstate = CtState.ESTABLISHED
            self.pending_dst = (o[1], o[2])
            self.pending_src = (o[3], o[4])
        else:
            ctx.ctstate = CtState.ESTABLISHED if entry.seen_reply else CtState.NEW
            self.pending_dst = (r[1], r[2])
            self.pending_src = (r[3], r[4])

    def apply_snat(self, device: str | None, nexthop: str | None, chosen: int | None = None) -> str | None:
        """Give a new flow its source mapping (``nf_nat_setup_info`` for the source, at
        POSTROUTING or INPUT): the one SNAT or MASQUERADE asked for, or a null binding to its
        own source, bound by :meth:`bind_source`. MASQUERADE takes ``device``'s address (or
        ``chosen``, when the flow cache knows it). A packet of an existing flow gets its
        entry's source.

        Returns ``None``, or why the packet is dropped: MASQUERADE found no address, or no
        port left the flow a free reply tuple (the kernel's confirmation then fails).
        """
        ctx = self.ctx
        if not self.new_flow:
            if self.pending_src is not None:
                ctx.src, ctx.sport = self.pending_src
            return None
        asked = ctx.snat
        if asked is None:  # a null binding: the flow's own source
            mapping: SourceRange = (None, None, None, False)
        else:
            addr, low, high, rand_all = asked
            if addr == -1:  # MASQUERADE: the out interface's address
                if chosen is None:
                    text = self.state.node.source_address(device or "lo", ctx.version, nexthop, ctx.dst)
                    if text is None:
                        return f"MASQUERADE: no address on {device or 'the way in'}"
                    chosen = parse_address(text)[1]
                addr = chosen
            mapping = (addr, low, high, rand_all)
        if self.observer is not None:
            self.observer.source_nat(device, nexthop, chosen)
        return self.bind_source(mapping)

    def bind_source(self, mapping: SourceRange) -> str | None:
        """Bind the new flow to ``mapping`` (address ``None``: its own) with the port
        :func:`~emulation.netfilter.nat.source_port` picks; why it is dropped, or ``None``."""
        ctx = self.ctx
        addr = ctx.src if mapping[0] is None else mapping[0]
        port, free = source_port(
            self.state.conntrack,
            ctx.version,
            ctx.proto,
            ctx.src,
            ctx.sport,
            ctx.dst,
            ctx.dport,
            mapping,
            ctx.rand,
        )
        if not free and self.observer is not None:
            self.observer.abandon()  # this packet's drop is not its path's: other packets may find a port
        if (addr, port) != (ctx.src, ctx.sport):
            ctx.ct_snat = True
            if ctx.ct_reply is not None:
                ctx.ct_reply = (ctx.ct_reply[0], ctx.ct_reply[1], addr, port)
        ctx.src, ctx.sport = addr, port
        return None if free else TUPLE_TAKEN

    def _drop(self, reason: str) -> Walked:
        return self._done(Verdict.DROP, Delivery.NONE, None, reason)

    def _done(self, verdict: Verdict, delivery: Delivery, device: str | None, reason: str) -> Walked:
        ctx, p = self.ctx, self.packet
        if self.observer is not None:
            self.observer.end(verdict, delivery, device, reason)
        orig_src, orig_dst = self.orig_src, self.orig_dst
        final = delivered(
            p, ctx.version, orig_src, orig_dst, ctx.src, ctx.dst, ctx.sport, ctx.dport, ctx.mark, device
        )
        outcome = Outcome(
            verdict=verdict,
            delivery=delivery,
            out_interface=device,
            packet=final,
            ctstate=ctx.ctstate,
            dnat=(ctx.dst, ctx.dport) != (orig_dst, p.dport) and not ctx.ct_dir_reply,
            snat=(ctx.src, ctx.sport) != (orig_src, p.sport) and not ctx.ct_dir_reply,
            masquerade=ctx.masquerade,
            reason=reason,
            uncertain=ctx.uncertain,
            trace=tuple(ctx.trace),
        )
        commit = None
        # A new flow's entry is confirmed when its packet leaves the last hook (ipv4_confirm),
        # so only an accepted packet makes one, or a packet of the node to itself that
        # POSTROUTING let through (confirmed before it loops back over lo, so a DROP or REJECT
        # in INPUT leaves it). An existing entry is updated when conntrack sees the packet, at
        # PREROUTING or OUTPUT (nf_conntrack_in: IPS_SEEN_REPLY, nf_ct_refresh_acct; a CONNMARK
        # writes ct->mark at once), whatever later rules decide.
        if verdict == Verdict.ACCEPT or self.confirmed or (self.entry is not None and not self.new_flow):
            commit = self._commit_fn()
        return outcome, ctx, commit

    def _commit_fn(self) -> Callable[[], None] | None:
        ctx, table = self.ctx, self.state.conntrack
        if self.new_flow and self.orig is not None:
            now = ctx.now
            reply: FlowKey = (ctx.version, ctx.dst, ctx.dport, ctx.src, ctx.sport, ctx.proto)
            entry = ConntrackEntry(
                original=self.orig,
                reply=reply,
                created_s=now,
                expires_s=now + timeout_s(ctx.proto, False, 0.0),
                mark=ctx.ctmark,
            )
            return lambda: table.confirm(entry)
        if self.entry is not None:
            existing, is_reply, mark = self.entry, ctx.ct_dir_reply, ctx.ctmark

            def refresh() -> None:
                table.refresh(existing, reply=is_reply, mark=mark)

            return refresh
        return None
