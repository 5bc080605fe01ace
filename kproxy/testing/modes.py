"""Mode adapters: each answers ``outcome(cluster, packet)`` for one proxy mode, in one vocabulary.

Theory of operation: an adapter (:class:`ModeAdapter`) turns a :class:`~kproxy.testing.Cluster`
and a :class:`~kproxy.testing.Packet` into an :class:`~kproxy.testing.Outcome`, and answers
:meth:`ModeAdapter.connections` (which endpoint each of a client's successive connections reaches,
at given times) for session-affinity checks. Adapters are registered by name
(:func:`register_mode`); adding a mode is a class with those two methods and one call.

- ``userspace``: the legacy userspace proxier as kproxy serves it. A listener per ClusterIP
  service port (TCP and UDP; SCTP never was served); a port without endpoints refuses; the
  endpoints are the port's internal ones, handed out by :class:`~kproxy.modes.userspace.RoundRobinBalancer`
  (the real balancer, called directly). Its distribution is the share of each endpoint over one
  full rotation (exact). NodePorts, external and load-balancer IPs are not served: such packets
  pass unchanged.
- ``iptables``: kube-proxy's rules as :class:`~kproxy.modes.iptables.IptablesRenderer` writes
  them, loaded into an emulated node (:func:`~kproxy.testing.cluster.emulated_node`) as a full
  sync, every outcome enumerated with its probability.
- ``iptables-sampled``: the same rules, with the packet *sent* ``samples`` times from fresh
  state with a seeded generator; a check of the emulator's sampling path and of the statistical
  bound used for sampled modes.
- ``nftables``: kube-proxy's nftables table as the nftables mode programs it on a full sync,
  in an :class:`emulation.nftables.Netns` (``route_localnet`` off), enumerated as iptables; its
  documented differences from iptables are in :mod:`kproxy.testing.differences`.
- ``ipvs``: kube-proxy's IPVS table, ipsets and rules on an emulated node
  (:class:`IpvsAdapter`); the verdict is the first packet's, the distribution and masquerade
  those of simulated new connections (sampled). Registered only when :mod:`kproxy.modes.ipvs`
  exists (see :func:`available_modes`); its real differences from iptables are in
  :mod:`kproxy.testing.differences`.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

from emulation import ManualClock
from emulation import nftables as nft
from emulation.netfilter import Netns, Ruleset
from kproxy.errors import InvalidArgument
from kproxy.kernel.emulated import EmulatedNetfilter, run_now
from kproxy.kernel.emulated_nftables import EmulatedNftables
from kproxy.kernel.ipvs_node import IpvsNode
from kproxy.model import IPFamily, ServicePortInfo
from kproxy.model import Protocol as L4Protocol
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer
from kproxy.modes.iptables.mode import load_now
from kproxy.modes.ipvs import IpvsConfig, render
from kproxy.modes.ipvs.mode import IpvsMode
from kproxy.modes.nftables import NftablesConfig, NftablesMode
from kproxy.modes.userspace import RoundRobinBalancer
from kproxy.testing.cluster import Cluster, Packet, emulated_node
from kproxy.testing.outcome import EndpointShares, Outcome, Verdict
from kproxy.trace.ipvs import trace_ipvs
from kproxy.trace.netfilter import trace_packet

__all__ = [
    "DEFAULT_MODES",
    "DumpAdapter",
    "IptablesAdapter",
    "IptablesSampledAdapter",
    "IpvsAdapter",
    "ModeAdapter",
    "NftablesAdapter",
    "UserspaceAdapter",
    "available_modes",
    "get_mode",
    "iptables_config",
    "register_mode",
]

#: The modes checked when none are named.
DEFAULT_MODES: tuple[str, ...] = ("userspace", "iptables", "nftables", "ipvs")


@runtime_checkable
class ModeAdapter(Protocol):
    """What every mode answers (see the module docstring).

    Attributes:
        name: the mode's name, as :func:`register_mode` registered it.
    """

    name: str

    def outcome(self, cluster: Cluster, packet: Packet, *, trace: bool = False) -> Outcome:
        """What the mode does with the first packet of a new connection like ``packet``.

        Args:
            cluster: the cluster and node.
            packet: the packet.
            trace: fill :attr:`Outcome.trace` (slower).
        """
        ...

    def connections(self, cluster: Cluster, packet: Packet, times_s: Sequence[float]) -> list[str | None]:
        """The endpoint (``ip:port``) each new connection from ``packet``'s client reaches.

        Connection ``i`` is opened at ``times_s[i]`` seconds (non-decreasing) from a new source
        port, starting from a mode with no state; None where it is not translated.
        """
        ...


_REGISTRY: dict[str, Callable[[], ModeAdapter]] = {}


def register_mode(name: str, factory: Callable[[], ModeAdapter]) -> None:
    """Make mode ``name`` available to :func:`get_mode` (a later registration replaces it).

    Raises:
        InvalidArgument: an empty name or a factory that is not callable.
    """
    if not isinstance(name, str) or not name or not callable(factory):
        raise InvalidArgument(
            f"register_mode needs a name and a callable factory, got {name=!r}, {factory=!r}")
    _REGISTRY[name] = factory


def available_modes() -> tuple[str, ...]:
    """The registered modes, in registration order."""
    return tuple(_REGISTRY)


def get_mode(name: str | ModeAdapter) -> ModeAdapter:
    """The adapter of mode ``name`` (an adapter is returned as it is).

    Raises:
        InvalidArgument: no such mode (the message lists the registered ones).
    """
    if isinstance(name, ModeAdapter):
        return name
    factory = _REGISTRY.get(name)
    if factory is None:
        raise InvalidArgument(f"modes: unknown mode {name!r}; available: {', '.join(_REGISTRY)}")
    return factory()


# -- helpers shared by adapters -------------------------------------------------------------------


def _ports_of(cluster: Cluster, packet: Packet) -> list[ServicePortInfo]:
    return [info for info in cluster.snapshot if info.family is packet.family]


def _external_kind(cluster: Cluster, packet: Packet) -> str | None:
    """What ``packet.dst:dport`` is when it is a NodePort, external IP or LB IP, else None."""
    node_ip = cluster.node.node_ip(packet.version)
    for info in _ports_of(cluster, packet):
        if info.protocol is not packet.protocol:
            continue
        if info.node_port and packet.dport == info.node_port and (
                packet.dst == node_ip or packet.dst in ("127.0.0.1", "::1")):
            return f"NodePort {info.node_port} of {info.name}"
        if packet.dport == info.port and packet.dst in info.external_ips:
            return f"external IP {packet.dst} of {info.name}"
        if packet.dport == info.port and packet.dst in info.load_balancer_ips:
            return f"load-balancer IP {packet.dst} of {info.name}"
    return None


# -- userspace ------------------------------------------------------------------------------------


class UserspaceAdapter:
    """The userspace mode through its pure balancer (see the module docstring)."""

    name = "userspace"

    def _listener(self, cluster: Cluster, packet: Packet) -> tuple[ServicePortInfo | None, Outcome | None]:
        """The service port whose listener takes ``packet``, or the outcome when none does."""
        on_ip = [i for i in _ports_of(cluster, packet) if i.cluster_ip == packet.dst]
        if not on_ip:
            kind = _external_kind(cluster, packet)
            why = (f"not proxied: {kind} (the userspace mode serves ClusterIPs only)" if kind
                   else f"no Service at {packet.dst}: not proxied, routed as the node routes it")
            return None, Outcome(mode=self.name, verdict=Verdict.ACCEPT, summary=why, trace=(why,))
        info = next((i for i in on_ip if i.port == packet.dport and i.protocol is packet.protocol), None)
        if info is None:
            why = (f"no listener on {packet.dst} port {packet.dport}/{packet.protocol}: the connection "
                   "is refused")
            return None, Outcome(mode=self.name, verdict=Verdict.REJECT, summary=why, trace=(why,))
        if info.protocol is L4Protocol.SCTP:
            why = f"{info.name} is SCTP, which the userspace mode never served: no listener, refused"
            return None, Outcome(mode=self.name, verdict=Verdict.REJECT, summary=why, trace=(why,))
        if not info.internal_endpoints:
            why = f"{info.name} has no endpoints: its listener refuses (as kube-proxy's REJECT rule)"
            return None, Outcome(mode=self.name, verdict=Verdict.REJECT, summary=why, trace=(why,))
        return info, None

    def outcome(self, cluster: Cluster, packet: Packet, *, trace: bool = False) -> Outcome:
        """The balancer's share of each endpoint over one rotation (see :class:`ModeAdapter`)."""
        info, refused = self._listener(cluster, packet)
        if refused is not None:
            return refused
        assert info is not None
        addresses = [ep.address for ep in info.internal_endpoints]
        balancer = RoundRobinBalancer(addresses, name=str(info.name))
        picks = [balancer.next_endpoint(f"client-{i}", 0.0) for i in range(len(balancer.endpoints))]
        counts = Counter(picks)
        shares = EndpointShares({a: Fraction(c, len(picks)) for a, c in counts.items()})
        lines = (f"listener for {info.name} ({info.cluster_ip}:{info.port}/{info.protocol})",
                 f"balancer rotation over {len(picks)} connections: {', '.join(picks)}")
        return Outcome(mode=self.name, verdict=Verdict.ACCEPT, endpoints=shares, masquerade=None,
                       summary=f"proxied by the listener of {info.name}", trace=lines if trace else ())

    def connections(self, cluster: Cluster, packet: Packet, times_s: Sequence[float]) -> list[str | None]:
        """Successive picks of one balancer for ``packet.src`` (see :class:`ModeAdapter`)."""
        info, _ = self._listener(cluster, packet)
        if info is None:
            return [None] * len(times_s)
        balancer = RoundRobinBalancer([ep.address for ep in info.internal_endpoints],
                                      affinity_ttl_s=info.session_affinity_timeout_s, name=str(info.name))
        return [balancer.next_endpoint(packet.src, t) for t in times_s]


# -- iptables -------------------------------------------------------------------------------------


def iptables_config(cluster: Cluster, family: IPFamily) -> IptablesConfig:
    """The iptables settings for ``cluster``'s node, rendering ``family``."""
    node = cluster.node
    return IptablesConfig(family=family, node_ips=node.node_ips, cluster_cidr=node.cluster_cidrs,
                          masquerade_all=node.masquerade_all, nodeport_addresses=node.nodeport_addresses)


_CACHE_SIZE = 32
_rulesets: OrderedDict[tuple[str, IPFamily], Ruleset] = OrderedDict()


def _ruleset(cluster: Cluster, family: IPFamily) -> Ruleset:
    """The node's ruleset after a full sync of ``cluster`` (cached per cluster and family)."""
    key = (cluster.fingerprint, family)
    held = _rulesets.get(key)
    if held is not None:
        _rulesets.move_to_end(key)
        return held
    netns = Netns(emulated_node(cluster.node), ManualClock(),
                  ruleset=Ruleset(6 if family is IPFamily.IPv6 else 4))
    renderer = IptablesRenderer(iptables_config(cluster, family))
    load_now(EmulatedNetfilter(netns, family), renderer.render(cluster.snapshot))
    _rulesets[key] = netns.ruleset
    while len(_rulesets) > _CACHE_SIZE:
        _rulesets.popitem(last=False)
    return netns.ruleset


def fresh_netns(cluster: Cluster, family: IPFamily, clock: ManualClock | None = None) -> Netns:
    """A new emulated node holding ``cluster``'s iptables rules, with no conntrack or ``recent`` state."""
    return Netns(emulated_node(cluster.node), clock or ManualClock(), ruleset=_ruleset(cluster, family))


class IptablesAdapter:
    """The iptables mode in the emulator, every outcome enumerated (see the module docstring)."""

    name = "iptables"

    def netns(self, cluster: Cluster, family: IPFamily, clock: ManualClock | None = None) -> Netns:
        """A fresh emulated node holding the rules this adapter evaluates (a full sync of ``cluster``)."""
        return fresh_netns(cluster, family, clock)

    def outcome(self, cluster: Cluster, packet: Packet, *, trace: bool = False) -> Outcome:
        """Enumerate ``packet`` through a full sync's rules (see :class:`ModeAdapter`)."""
        netns = self.netns(cluster, packet.family)
        emulated = packet.to_emulated()
        if trace:
            result = trace_packet(netns, emulated)
            outcomes = list(result.outcomes)
            lines = tuple(f"{t.hook} {t.table} {t.chain}: {t.rule}" for t in result.trace)
        else:
            outcomes = netns.enumerate(emulated)
            lines = ()
        weight: dict[str, float] = {}
        endpoints: dict[str, float] = {}
        for p, o in outcomes:
            weight[o.verdict] = weight.get(o.verdict, 0.0) + p
            if o.verdict == "ACCEPT" and o.dnat:
                endpoints[o.destination] = endpoints.get(o.destination, 0.0) + p
        verdict = max(("ACCEPT", "DROP", "REJECT"), key=lambda v: weight.get(v, 0.0))
        masq = any(o.masquerade for _, o in outcomes if o.verdict == "ACCEPT")
        reasons = sorted({o.reason for _, o in outcomes})
        uncertain = any(o.uncertain for _, o in outcomes)
        summary = "; ".join(reasons) + (" (uncertain: an unmodelled match was met)" if uncertain else "")
        return Outcome(mode=self.name, verdict=Verdict(verdict), endpoints=EndpointShares(endpoints),
                       masquerade=masq, summary=summary, trace=lines)

    def connections(self, cluster: Cluster, packet: Packet, times_s: Sequence[float]) -> list[str | None]:
        """Send one new flow per time through one emulated node, sampling (see :class:`ModeAdapter`)."""
        clock = ManualClock()
        netns = self.netns(cluster, packet.family, clock)
        rng = random.Random(0)
        out: list[str | None] = []
        for i, t in enumerate(times_s):
            clock.advance(max(0.0, t - clock.now()))
            o = netns.send(packet.to_emulated(sport=1024 + (packet.sport + i) % 64000), rng)
            out.append(o.destination if o.verdict == "ACCEPT" and o.dnat else None)
        return out


class IptablesSampledAdapter(IptablesAdapter):
    """The iptables mode sampled: ``samples`` first packets, each from fresh state, seeded.

    Args:
        samples: connections per outcome (>= 1).
        seed: the generator's seed.

    Raises:
        InvalidArgument: ``samples`` < 1.
    """

    name = "iptables-sampled"

    def __init__(self, samples: int = 400, seed: int = 0) -> None:
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise InvalidArgument(f"samples must be an int >= 1, got {samples=!r}")
        self.samples = samples
        self.seed = seed

    def outcome(self, cluster: Cluster, packet: Packet, *, trace: bool = False) -> Outcome:
        """Sample ``samples`` first packets (see :class:`ModeAdapter`)."""
        rng = random.Random(self.seed)
        verdicts: Counter[str] = Counter()
        hits: Counter[str] = Counter()
        masq = False
        for _ in range(self.samples):
            o = self.netns(cluster, packet.family).send(packet.to_emulated(), rng)
            verdicts[o.verdict] += 1
            if o.verdict == "ACCEPT":
                masq = masq or o.masquerade
                if o.dnat:
                    hits[o.destination] += 1
        verdict = max(("ACCEPT", "DROP", "REJECT"), key=lambda v: verdicts.get(v, 0))
        shares = EndpointShares({a: c / self.samples for a, c in hits.items()})
        return Outcome(mode=self.name, verdict=Verdict(verdict), endpoints=shares, masquerade=masq,
                       samples=self.samples,
                       summary=f"verdicts over {self.samples} packets: {dict(verdicts)}")


class DumpAdapter(IptablesAdapter):
    """A node's own iptables rules (an ``iptables-save`` dump) in the emulator, enumerated.

    Answers like ``iptables`` but from ``ruleset`` (read leniently, other components' rules
    included), whatever cluster it is asked about: compare it with ``iptables`` to see whether a
    node behaves as kproxy would program it.

    Args:
        ruleset: the node's rules (:func:`emulation.netfilter.load` of the dump).
        name: the mode's name in reports.
    """

    def __init__(self, ruleset: Ruleset, name: str = "node-dump") -> None:
        self.ruleset = ruleset
        self.name = name

    def netns(self, cluster: Cluster, family: IPFamily, clock: ManualClock | None = None) -> Netns:
        """A fresh emulated node holding the dump's rules.

        Raises:
            InvalidArgument: ``family`` is not the dump's.
        """
        if (family is IPFamily.IPv6) != (self.ruleset.version == 6):
            raise InvalidArgument(f"the dump holds IPv{self.ruleset.version} rules; cannot answer {family}")
        return Netns(emulated_node(cluster.node), clock or ManualClock(), ruleset=self.ruleset)


_nft_rulesets: OrderedDict[tuple[str, IPFamily], nft.Ruleset] = OrderedDict()


class NftablesAdapter(IptablesAdapter):
    """The nftables mode in the emulator, every outcome enumerated as for iptables (module docstring).

    The settings are the node's (``--nodeport-addresses`` empty: kube-proxy's nftables default,
    ``primary``; ``service_cidrs`` when the node spec has them, for the DROP of unallocated
    ClusterIPs).
    """

    name = "nftables"

    def netns(self, cluster: Cluster, family: IPFamily, clock: ManualClock | None = None) -> Any:
        """A fresh emulated nftables node holding a full sync of ``cluster`` (rulesets cached)."""
        node = dataclasses.replace(emulated_node(cluster.node), route_localnet=False)
        key = (cluster.fingerprint, family)
        held = _nft_rulesets.get(key)
        if held is None:
            spec = cluster.node
            config = NftablesConfig.from_run(
                family=family, node_ips=spec.node_ips, cluster_cidr=spec.cluster_cidrs,
                masquerade_all=spec.masquerade_all, nodeport_addresses=spec.nodeport_addresses,
                service_cidr=tuple(getattr(spec, "service_cidrs", ())))
            built = nft.Netns(node, ManualClock())
            run_now(NftablesMode(config, EmulatedNftables(built, family), now=lambda: 0.0, history=0)
                    .apply(cluster.snapshot))
            held = _nft_rulesets[key] = built.ruleset
            while len(_nft_rulesets) > _CACHE_SIZE:
                _nft_rulesets.popitem(last=False)
        return nft.Netns(node, clock or ManualClock(), ruleset=held)


register_mode("userspace", UserspaceAdapter)
register_mode("iptables", IptablesAdapter)
register_mode("iptables-sampled", IptablesSampledAdapter)
register_mode("nftables", NftablesAdapter)


#: Longer than any IPVS connection entry the adapter creates lives (TCP SYN_RECV, UDP: 300 s), so a
#: persistence template, kept while it controls connections, has expired after it.
_IPVS_CONN_LIFE_S = 3600


class IpvsAdapter:
    """The ipvs mode in the emulator: kube-proxy's IPVS table, ipsets and rules on an emulated node.

    IPVS schedulers keep state (rr cursors, connection counts), so the distribution is each real
    server's share of ``connections`` new connections from the packet's client (source ports
    counting up) on a copy of a fresh node: a *sampled* outcome, compared within the stated bound.

    Args:
        scheduler: ``--ipvs-scheduler`` (default ``rr``).
        connections: new connections simulated per outcome (>= 1).

    Raises:
        InvalidArgument: ``connections`` < 1.
    """

    name = "ipvs"

    def __init__(self, scheduler: str = "rr", connections: int = 240) -> None:
        if isinstance(connections, bool) or not isinstance(connections, int) or connections < 1:
            raise InvalidArgument(f"connections must be an int >= 1, got {connections=!r}")
        self.scheduler = scheduler
        self.samples = connections

    def _node(self, cluster: Cluster, family: IPFamily, clock: ManualClock | None = None) -> Any:
        n = cluster.node
        config = IpvsConfig(family=family, node_ips=n.node_ips, cluster_cidr=n.cluster_cidrs,
                            masquerade_all=n.masquerade_all, nodeport_addresses=n.nodeport_addresses,
                            scheduler=self.scheduler)
        version = 6 if family is IPFamily.IPv6 else 4
        node = IpvsNode(emulated_node(n), clock or ManualClock(), version=version)
        IpvsMode.emulated(config, node).load(render(cluster.snapshot, config))
        return node

    def outcome(self, cluster: Cluster, packet: Packet, *, trace: bool = False) -> Outcome:
        """Shares of ``connections`` new connections (see :class:`ModeAdapter`).

        The verdict and trace are the first packet's. The shares and masquerade are those of the
        simulated connections, on a copy of the node: masquerade when any of them is
        masqueraded (as iptables' enumeration: any outcome), and with ClientIP affinity the
        connections are spaced past every persistence template's life (the affinity timeout,
        and the IPVS connections that keep a template alive), so each is a *first* connection
        scheduled afresh rather than one client following its template.
        """
        node = self._node(cluster, packet.family)
        emulated = packet.to_emulated()
        result = trace_ipvs(node, emulated)
        affinity = [i.session_affinity_timeout_s or 0 for i in cluster.snapshot if i.session_affinity]
        spacing = float(max(affinity) + _IPVS_CONN_LIFE_S) if affinity else 0.0
        sim = copy.deepcopy(node)
        counts: Counter[str] = Counter()
        masq = False
        for i in range(self.samples):
            if i and spacing:
                sim.clock.advance(spacing)
            got = sim.send(packet.to_emulated(sport=(packet.sport + i - 1) % 65535 + 1))
            if got.verdict == "ACCEPT":
                masq = masq or got.masquerade
                if got.dnat:
                    counts[got.destination] += 1
            if not counts:
                break  # no virtual server with a real server took it: the mode's rules draw nothing at
                # random and IPVS state matters only once one does, so every connection fares alike
        translated = bool(counts)
        summary = f"ipvs ({self.scheduler})" + (f", connections {spacing:g}s apart" if spacing else "")
        return Outcome(mode=self.name, verdict=Verdict(result.verdict),
                       endpoints=EndpointShares({a: c / self.samples for a, c in sorted(counts.items())}),
                       masquerade=masq if translated else result.masquerade,
                       samples=self.samples if translated else None,
                       summary=summary,
                       trace=tuple(f"{t.hook} {t.table} {t.chain}: {t.rule}" for t in result.trace)
                       if trace else ())

    def connections(self, cluster: Cluster, packet: Packet, times_s: Sequence[float]) -> list[str | None]:
        """Send one new flow per time through one emulated IPVS node (see :class:`ModeAdapter`)."""
        clock = ManualClock()
        node = self._node(cluster, packet.family, clock)
        out: list[str | None] = []
        for i, t in enumerate(times_s):
            clock.advance(max(0.0, t - clock.now()))
            o = node.send(packet.to_emulated(sport=1024 + (packet.sport + i) % 64000))
            out.append(o.destination if o.verdict == "ACCEPT" and o.dnat else None)
        return out


register_mode("ipvs", IpvsAdapter)
