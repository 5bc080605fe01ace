"""The values the equivalence checks talk about: a cluster on one node, and a packet sent to it.

Theory of operation: a :class:`Cluster` is a set of API objects (Services and EndpointSlices, as
``kubectl get -o yaml`` prints them) plus the node they are proxied on (:class:`NodeSpec`). It is
parsed once, at construction, into the model (:attr:`Cluster.services`, :attr:`Cluster.slices`)
and the node's :class:`~kproxy.model.Snapshot`; every mode adapter reads the same snapshot, so a
disagreement is a disagreement between modes, never between two parses.

A :class:`Packet` is the first packet of a connection as it reaches the node: addresses, ports,
protocol, and its *origin* (a pod on this node, a pod elsewhere, the node itself, localhost, an
external client), which decides how it enters the node (a pod bridge, ``eth0``, or the OUTPUT
hook). Its *target* says what it was aimed at (a ClusterIP, a NodePort ...); it is descriptive
only, for failure messages and statistics.

The node every emulator models (:func:`emulated_node`)::

    external clients, remote pods -- eth0 (node IPs, /24 and /64) -- NODE -- cbr0 -- local pods
                                                                  (10.244.0.1/24, fd00:10:244::1/64)
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from emulation import Interface, Node, Route
from emulation import Packet as EmulatedPacket
from kproxy.config.run import RunConfig
from kproxy.errors import ConfigError, InvalidArgument
from kproxy.model import (
    EndpointSlice,
    IPFamily,
    NodeConfig,
    Protocol,
    Service,
    Snapshot,
    build_snapshot,
    join_host_port,
    parse_objects,
)

__all__ = [
    "BRIDGE_INTERFACE",
    "EXTERNAL_INTERFACE",
    "Cluster",
    "NodeSpec",
    "Origin",
    "Packet",
    "Target",
    "emulated_node",
]

#: The interface external clients and pods on other nodes arrive on.
EXTERNAL_INTERFACE = "eth0"
#: The bridge this node's pods hang off.
BRIDGE_INTERFACE = "cbr0"


class Origin(StrEnum):
    """Where a packet comes from, which decides how it enters the node."""

    LOCAL_POD = "local-pod"
    REMOTE_POD = "remote-pod"
    NODE = "node"
    LOCALHOST = "localhost"
    EXTERNAL = "external"


class Target(StrEnum):
    """What a packet was aimed at (descriptive: the modes look only at addresses)."""

    CLUSTER_IP = "cluster-ip"
    NODE_PORT = "node-port"
    EXTERNAL_IP = "external-ip"
    LOAD_BALANCER = "load-balancer"
    UNKNOWN_PORT = "unknown-port"
    UNKNOWN_IP = "unknown-ip"


def _network(value: str, what: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise InvalidArgument(f"{what}: expected a CIDR, got {value!r}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """The node under test, as every mode sees it.

    Attributes:
        hostname: the node's name; endpoints whose ``nodeName`` equals it are local.
        node_ips: its addresses on ``eth0``; several per family are allowed (kube-proxy's
            fixtures have them), the first of a family is its primary IP.
        cluster_cidrs: the pod CIDRs (``--cluster-cidr``), at most one per family.
        local_pod_cidrs: this node's share of them, on the ``cbr0`` bridge (the gateway is the
            first address), one per family.
        masquerade_all: ``--masquerade-all``.
        nodeport_addresses: ``--nodeport-addresses`` (empty: every local address).
        families: the families proxied, primary first.
        zone: its ``topology.kubernetes.io/zone`` label (``--node-zone``), for topology hints.

    Raises:
        InvalidArgument: a malformed address or CIDR, two CIDRs of one family, a local pod CIDR
            outside the cluster CIDR, or no family.
    """

    hostname: str = "node-a"
    node_ips: tuple[str, ...] = ("192.168.0.2", "2001:db8::2")
    cluster_cidrs: tuple[str, ...] = ("10.244.0.0/16", "fd00:10:244::/48")
    local_pod_cidrs: tuple[str, ...] = ("10.244.0.0/24", "fd00:10:244::/64")
    masquerade_all: bool = False
    nodeport_addresses: tuple[str, ...] = ()
    families: tuple[IPFamily, ...] = (IPFamily.IPv4, IPFamily.IPv6)
    zone: str | None = None

    def __post_init__(self) -> None:
        if not self.families or len(set(self.families)) != len(self.families):
            raise InvalidArgument(f"families: expected IPv4 and/or IPv6 once each, got {self.families!r}")
        for ip in self.node_ips:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise InvalidArgument(f"node_ips: expected IP addresses, got {ip!r}") from None
        for name in ("cluster_cidrs", "local_pod_cidrs"):
            versions = [_network(c, name).version for c in getattr(self, name)]
            if len(set(versions)) != len(versions):
                raise InvalidArgument(f"{name}: one CIDR per family, got {getattr(self, name)!r}")
        for local in self.local_pod_cidrs:
            net = _network(local, "local_pod_cidrs")
            if net.num_addresses < 4:
                raise InvalidArgument(f"local_pod_cidrs: {local} is too small for a bridge and pods")
            outer = self.cluster_cidr(net.version)
            if outer is not None and not net.subnet_of(_network(outer, "cluster_cidrs")):  # type: ignore[arg-type]
                raise InvalidArgument(f"local_pod_cidrs: {local} is outside the cluster CIDR {outer}")

    @classmethod
    def from_run(cls, run: RunConfig, *, primary_family_only: bool = False) -> NodeSpec:
        """The node a run configuration describes (``kproxy verify``'s node flags).

        Without ``--node-ip`` or ``--cluster-cidr`` the defaults of this class stand in; this
        node's pods are the first /24 (/64) of each cluster CIDR. The families are the
        configuration's (those of the node IPs unless given), or only the primary one.

        Raises:
            ConfigError: ``--ip-families`` names a family no ``--node-ip`` has, or the values do
                not make a node (naming the flags).
        """
        node = run.node
        cidrs = run.rules.cluster_cidrs or cls().cluster_cidrs
        local = []
        for cidr in cidrs:
            net = ipaddress.ip_network(cidr, strict=False)
            size = 24 if net.version == 4 else 64
            local.append(str(next(net.subnets(new_prefix=size)) if net.prefixlen < size else net))
        families = node.ip_families[:1] if primary_family_only else node.ip_families
        have = {IPFamily.IPv6 if ":" in ip else IPFamily.IPv4 for ip in node.node_ips}
        missing = [f for f in families if node.node_ips and f not in have]
        if missing:
            raise ConfigError(f"--ip-families {','.join(families)}: no --node-ip of {missing[0]} "
                              f"(given: {', '.join(node.node_ips)})")
        try:
            return cls(hostname=node.hostname, node_ips=node.node_ips or cls().node_ips, cluster_cidrs=cidrs,
                       local_pod_cidrs=tuple(local), masquerade_all=run.rules.masquerade_all,
                       nodeport_addresses=run.rules.nodeport_addresses, families=families, zone=node.zone)
        except InvalidArgument as err:
            raise ConfigError(f"node flags (--node-ip, --cluster-cidr): {err}") from None

    def node_ip(self, version: int) -> str | None:
        """The node IP of IP ``version`` (4 or 6), or None."""
        return next((ip for ip in self.node_ips if ipaddress.ip_address(ip).version == version), None)

    def cluster_cidr(self, version: int) -> str | None:
        """The pod CIDR of IP ``version``, or None."""
        return next((c for c in self.cluster_cidrs if _network(c, "cluster_cidrs").version == version), None)

    def local_pod_cidr(self, version: int) -> str | None:
        """This node's pod CIDR of IP ``version``, or None."""
        return next((c for c in self.local_pod_cidrs if _network(c, "local_pod_cidrs").version == version),
                    None)

    def node_config(self) -> NodeConfig:
        """The model's view of this node."""
        return NodeConfig(hostname=self.hostname, zone=self.zone, ip_families=self.families)


def emulated_node(spec: NodeSpec) -> Node:
    """The emulated node of the module docstring for ``spec``.

    ``eth0`` carries the node IPs (a TEST-NET placeholder for a family without one, so that
    MASQUERADE always has an address) with a default route through the first address of the
    subnet; ``cbr0`` carries the first address of each local pod CIDR; ``route_localnet`` is on,
    as kube-proxy sets it for localhost NodePorts.
    """
    eth: list[str] = []
    routes: list[Route] = []
    for version, placeholder in ((4, "192.0.2.2"), (6, "2001:db8:ffff::2")):
        ip = spec.node_ip(version) or placeholder
        prefix = 24 if version == 4 else 64
        net = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
        eth.append(f"{ip}/{prefix}")
        gateway = str(next(a for a in net.hosts() if str(a) != ip))
        routes.append(Route(destination="default", device=EXTERNAL_INTERFACE, via=gateway, version=version))
        extra = [a for a in spec.node_ips if ipaddress.ip_address(a).version == version and a != ip]
        eth.extend(f"{a}/{32 if version == 4 else 128}" for a in extra)  # secondary node addresses
    bridge = []
    for cidr in spec.local_pod_cidrs:
        net = _network(cidr, "local_pod_cidrs")
        bridge.append(f"{next(net.hosts())}/{net.prefixlen}")
    return Node(
        interfaces=(Interface(name=EXTERNAL_INTERFACE, addresses=tuple(eth)),
                    Interface(name=BRIDGE_INTERFACE, addresses=tuple(bridge))),
        routes=tuple(routes),
        route_localnet=True,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Packet:
    """The first packet of a connection (or UDP flow) as it reaches the node.

    Attributes:
        src, dst: IP addresses of one family.
        sport, dport: ports, 1..65535.
        protocol: TCP, UDP or SCTP.
        origin: where it comes from (how it enters the node).
        target: what it was aimed at (descriptive only).

    Raises:
        InvalidArgument: malformed or mixed-family addresses, or a port out of range.
    """

    src: str
    dst: str
    sport: int
    dport: int
    protocol: Protocol = Protocol.TCP
    origin: Origin = Origin.EXTERNAL
    target: Target = Target.CLUSTER_IP

    def __post_init__(self) -> None:
        try:
            src, dst = ipaddress.ip_address(self.src), ipaddress.ip_address(self.dst)
        except ValueError:
            raise InvalidArgument(f"src and dst must be IP addresses, got src={self.src!r}, "
                                  f"dst={self.dst!r}") from None
        if src.version != dst.version:
            raise InvalidArgument(f"src and dst must be of one family, got src={self.src!r}, "
                                  f"dst={self.dst!r}")
        object.__setattr__(self, "src", str(src))
        object.__setattr__(self, "dst", str(dst))
        for name in ("sport", "dport"):
            value = getattr(self, name)
            if not 1 <= value <= 65535:
                raise InvalidArgument(f"{name} must be 1..65535, got {value}")
        object.__setattr__(self, "protocol", Protocol(self.protocol))
        object.__setattr__(self, "origin", Origin(self.origin))
        object.__setattr__(self, "target", Target(self.target))

    @property
    def family(self) -> IPFamily:
        """The packet's IP family."""
        return IPFamily.IPv6 if ":" in self.dst else IPFamily.IPv4

    @property
    def version(self) -> int:
        """4 or 6."""
        return 6 if ":" in self.dst else 4

    def to_emulated(self, *, sport: int | None = None) -> EmulatedPacket:
        """This packet for :mod:`emulation` (entering through ``cbr0``, ``eth0`` or OUTPUT)."""
        interface = {Origin.LOCAL_POD: BRIDGE_INTERFACE, Origin.REMOTE_POD: EXTERNAL_INTERFACE,
                     Origin.EXTERNAL: EXTERNAL_INTERFACE}.get(self.origin)
        return EmulatedPacket(src=self.src, dst=self.dst, sport=self.sport if sport is None else sport,
                              dport=self.dport, protocol=self.protocol.value.lower(),  # type: ignore[arg-type]
                              in_interface=interface)

    def __str__(self) -> str:
        return (f"{self.protocol} {join_host_port(self.src, self.sport)} -> "
                f"{join_host_port(self.dst, self.dport)} ({self.origin} to {self.target})")


_KINDS = ("Service", "EndpointSlice")


def _check_kind(item: object, where: str) -> None:
    """Refuse anything but a Service, an EndpointSlice or a List of them (nothing silently ignored)."""
    kind = item.get("kind") if isinstance(item, Mapping) else None
    if kind == "List" or (isinstance(kind, str) and kind.endswith("List") and kind[:-4] in _KINDS):
        items = item.get("items") if isinstance(item, Mapping) else None
        if not isinstance(items, list):
            raise InvalidArgument(f"{where}: a {kind} without an items list")
        for j, sub in enumerate(items):
            _check_kind(sub, f"{where}.items[{j}]")
        return
    if kind not in _KINDS:
        shown = repr(item) if len(repr(item)) <= 80 else repr(item)[:77] + "..."
        raise InvalidArgument(f"{where}: expected a Service or EndpointSlice dict (or a List of them), got "
                              f"kind {kind!r}: {shown}")


def _fingerprint(manifests: Sequence[Mapping[str, Any]], node: NodeSpec) -> str:
    text = json.dumps([list(manifests), repr(node)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Cluster:
    """Services and EndpointSlices (API dicts) proxied on one node, parsed once.

    Equality and hashing go by :attr:`fingerprint` (the manifests' canonical JSON and the node),
    so adapters can cache what they build per cluster.

    Attributes:
        manifests: the API objects, as ``kubectl get -o yaml`` prints them (plain dicts).
        node: the node under test.
        services, slices: the parsed model objects (set at construction).
        snapshot: the node's Snapshot (set at construction).
        fingerprint: a digest of ``manifests`` and ``node``.

    Raises:
        InvalidArgument: a manifest is not a Service, EndpointSlice or List of them (naming its
            index), or does not parse (the message quotes the problem).
    """

    manifests: tuple[Mapping[str, Any], ...]
    node: NodeSpec = NodeSpec()
    services: tuple[Service, ...] = field(default=(), init=False)
    slices: tuple[EndpointSlice, ...] = field(default=(), init=False)
    snapshot: Snapshot = field(default=None, init=False)  # type: ignore[assignment]
    fingerprint: str = field(default="", init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "manifests", tuple(self.manifests))
        for i, item in enumerate(self.manifests):
            _check_kind(item, f"manifests[{i}]")
        result = parse_objects({"apiVersion": "v1", "kind": "List", "items": list(self.manifests)},
                               source="cluster")
        if result.problems:
            raise InvalidArgument(f"manifests: {result.problems[0]}")
        services = tuple(o for o in result.objects if isinstance(o, Service))
        slices = tuple(o for o in result.objects if isinstance(o, EndpointSlice))
        object.__setattr__(self, "services", services)
        object.__setattr__(self, "slices", slices)
        object.__setattr__(self, "snapshot", build_snapshot(services, slices, self.node.node_config()))
        object.__setattr__(self, "fingerprint", _fingerprint(self.manifests, self.node))

    @classmethod
    def from_objects(cls, services: Iterable[Service], slices: Iterable[EndpointSlice],
                     node: NodeSpec | None = None) -> Cluster:
        """A cluster of already parsed objects (e.g. read by :func:`kproxy.sources.manifests.load_manifests`).

        The manifests are left empty and the fingerprint covers the objects' representation.
        """
        obj = cls.__new__(cls)
        spec = node or NodeSpec()
        svcs, slcs = tuple(services), tuple(slices)
        for name, value in (("manifests", ()), ("node", spec), ("services", svcs), ("slices", slcs),
                            ("snapshot", build_snapshot(svcs, slcs, spec.node_config())),
                            ("fingerprint", hashlib.sha256(repr((svcs, slcs, spec)).encode()).hexdigest())):
            object.__setattr__(obj, name, value)
        return obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cluster) and other.fingerprint == self.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        names = ", ".join(f"{s.namespace}/{s.name}" for s in self.services)
        return f"Cluster(services=[{names}], slices={len(self.slices)}, node={self.node.hostname!r})"

    def endpoint_addresses(self) -> frozenset[str]:
        """Every endpoint ``ip:port`` of every proxied service port."""
        return frozenset(ep.address for info in self.snapshot for ep in info.endpoints)
