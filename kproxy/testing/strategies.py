"""Hypothesis strategies for Services, EndpointSlices, whole clusters and the packets sent to them.

Everything is generated as API dicts (what ``kubectl get -o yaml`` prints and what
:meth:`kproxy.sources.memory.MemorySource.apply` takes), and :func:`clusters` wraps them in a
:class:`~kproxy.testing.Cluster`, which parses them once into the model. The strategies are
biased toward what breaks proxies: several ports and protocols on one Service (TCP and UDP on
one number), named ports resolving to different numbers in different slices, the same endpoint
in several slices with different conditions, ready / serving / terminating mixes, endpoints on
this node, on another node and on none, both traffic policies, ClientIP affinity, NodePorts,
external IPs, load-balancer IPs with source ranges, IPv4, IPv6 and dual-stack, Services without
any endpoint, and the edge ports 1 and 65535.

Addresses are allocated by a Service's ``index`` in its cluster, so a cluster's Services never
share a ClusterIP, NodePort, external IP or load-balancer IP (kube-proxy's behaviour for two
Services claiming one address is rule order, not a contract):

=====================  ==============================  ==================================
what                   IPv4                            IPv6
=====================  ==============================  ==================================
ClusterIP              ``10.96.0.<index+1>``           ``fd00:10:96::<index+1>``
external IP            ``192.168.99.<index+1>``        ``2001:db8:99::<index+1>``
load-balancer IP       ``198.51.100.<index+1>``        ``2001:db8:100::<index+1>``
NodePort               ``30000 + 10 * index + port``   (the same)
pods on this node      the node's local pod CIDR       (the same)
pods elsewhere         ``10.244.1.0/24``               ``fd00:10:244:1::/64``
external clients       ``203.0.113.0/24``              ``2001:db8:203::/64``
=====================  ==============================  ==================================

Arguments are validated when the strategy is built (:class:`~kproxy.errors.InvalidArgument`
naming the argument); no strategy here can be empty.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from kproxy.errors import InvalidArgument
from kproxy.model import IPFamily, Protocol, ServicePortInfo
from kproxy.testing.cluster import Cluster, NodeSpec, Origin, Packet, Target

__all__ = [
    "MAX_SERVICES",
    "REMOTE_NODE",
    "clusters",
    "endpoint_slices",
    "packets",
    "services",
]

#: The most Services a cluster may have (the address plan above has room for 200).
MAX_SERVICES = 200
#: The name of the other node endpoints may run on.
REMOTE_NODE = "node-b"
_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
_REMOTE_PODS = {4: "10.244.1.0/24", 6: "fd00:10:244:1::/64"}
_EXTERNAL = {4: "203.0.113.0/24", 6: "2001:db8:203::/64"}
_UNKNOWN_IPS = {4: ("10.96.255.254", "8.8.8.8", "192.168.99.250"), 6: ("fd00:10:96::fffe", "2001:db8:99::fa")}
_SERVICE_PORTS = (80, 443, 53, 8080, 1, 65535)
_ENDPOINT_PORTS = (8080, 8081, 9376, 1, 65535)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: Endpoint conditions, as the API may carry them (missing fields default as the API does).
_CONDITIONS: tuple[dict[str, bool], ...] = (
    {},
    {"ready": True},
    {"ready": False},
    {"ready": False, "serving": True, "terminating": True},
    {"ready": False, "serving": False, "terminating": True},
    {"ready": False, "serving": True},
)


def _check_bounds(name_min: str, low: int, name_max: str, high: int, *, floor: int = 0,
                  ceiling: int | None = None) -> None:
    for name, value in ((name_min, low), (name_max, high)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"{name} must be an int, got {value!r}")
        if value < floor or (ceiling is not None and value > ceiling):
            upper = "" if ceiling is None else f"..{ceiling}"
            raise InvalidArgument(f"{name} must be in {floor}{upper or '..'}, got {name}={value}")
    if low > high:
        raise InvalidArgument(f"{name_min}={low} must be <= {name_max}={high}")


def _check_families(families: Sequence[IPFamily], name: str = "families") -> tuple[IPFamily, ...]:
    if isinstance(families, str | IPFamily):
        raise InvalidArgument(f"{name} must be a sequence of IPFamily, got {families!r}")
    out: list[IPFamily] = []
    for f in families:
        try:
            family = IPFamily(f)
        except ValueError:
            raise InvalidArgument(f"{name}: unknown IP family {f!r}; expected IPv4 or IPv6") from None
        if family not in out:
            out.append(family)
    if not out:
        raise InvalidArgument(f"{name} must name at least one IP family, got {families!r}")
    return tuple(out)


def _check_index(index: int) -> None:
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_SERVICES:
        raise InvalidArgument(f"index must be an int in 0..{MAX_SERVICES - 1}, got {index=!r}")


def _ip(version: int, v4: str, v6: str, index: int) -> str:
    base = v4 if version == 4 else v6
    return str(ipaddress.ip_address(base) + index + 1)


def _version(family: IPFamily) -> int:
    return 6 if family is IPFamily.IPv6 else 4


@st.composite
def _ports(draw: st.DrawFn, index: int, min_ports: int, max_ports: int, node_ports: bool,
           protocols: tuple[str, ...]) -> list[dict[str, Any]]:
    count = draw(st.integers(min_value=min_ports, max_value=max_ports))
    out: list[dict[str, Any]] = []
    used: set[tuple[int, str]] = set()
    for i in range(count):
        protocol = draw(st.sampled_from(protocols))
        number = draw(st.sampled_from(_SERVICE_PORTS) | st.integers(min_value=1, max_value=65535))
        other = "UDP" if out and out[-1]["protocol"] == "TCP" else "TCP"
        if i and other in protocols and draw(st.booleans()):
            # TCP and UDP on one number, as DNS does.
            number, protocol = out[-1]["port"], other
        if (number, protocol) in used:
            continue
        used.add((number, protocol))
        port: dict[str, Any] = {"name": f"p{i}" if count > 1 or draw(st.booleans()) else "",
                                "protocol": protocol, "port": number}
        target = draw(st.sampled_from([None, "http", 8080, number]))
        if target is not None:
            port["targetPort"] = target
        if node_ports:
            port["nodePort"] = 30000 + 10 * index + i
        out.append(port)
    return out


def services(
    *,
    index: int = 0,
    families: Sequence[IPFamily] = (IPFamily.IPv4, IPFamily.IPv6),
    types: Sequence[str] = _TYPES,
    min_ports: int = 1,
    max_ports: int = 3,
    protocols: Sequence[str] = ("TCP", "UDP", "SCTP"),
    namespace: str = "ns",
    session_affinity: bool | None = None,
) -> st.SearchStrategy[dict[str, Any]]:
    """v1 Service dicts named ``svc<index>`` in ``namespace``, with addresses from the plan above.

    Args:
        index: the Service's place in its cluster (0..199); it picks the name and addresses.
        families: the families its ClusterIPs may be of (single-stack in either, or dual-stack
            in either order when both are given).
        types: the Service types drawn from (``ClusterIP``, ``NodePort``, ``LoadBalancer``).
        min_ports, max_ports: how many ports (1..8); TCP and UDP may share a number.
        protocols: the port protocols drawn from (TCP, UDP, SCTP).
        namespace: the namespace.
        session_affinity: ClientIP affinity always (True), never (False) or sometimes (None).

    Raises:
        InvalidArgument: an argument out of range, unknown, or empty (naming it).
    """
    _check_index(index)
    fams = _check_families(families)
    if isinstance(types, str) or not types or any(t not in _TYPES for t in types):
        raise InvalidArgument(f"types must be a non-empty sequence drawn from {_TYPES}, got {types!r}")
    _check_bounds("min_ports", min_ports, "max_ports", max_ports, floor=1, ceiling=8)
    if isinstance(protocols, str) or not protocols or any(p not in Protocol.__members__ for p in protocols):
        raise InvalidArgument(f"protocols must be a non-empty sequence of TCP, UDP, SCTP, got {protocols!r}")
    if not isinstance(namespace, str) or not _DNS_LABEL.fullmatch(namespace):
        raise InvalidArgument(f"namespace must be a DNS label (lower-case letters, digits and '-', at "
                              f"most 63, starting and ending with a letter or digit), got {namespace!r}")
    stacks: list[tuple[IPFamily, ...]] = [(f,) for f in fams]
    if len(fams) == 2:
        stacks += [fams, fams[::-1]]
    # TCP first in the list and weighted: SCTP is the rare protocol.
    weighted = tuple(sorted(protocols, key=lambda p: ("TCP", "UDP", "SCTP").index(p)))
    if session_affinity not in (True, False, None):
        raise InvalidArgument(f"session_affinity must be True, False or None, got {session_affinity!r}")
    return _services(index, tuple(stacks), tuple(types), min_ports, max_ports, weighted, namespace,
                     session_affinity)


@st.composite
def _services(draw: st.DrawFn, index: int, stacks: tuple[tuple[IPFamily, ...], ...], types: tuple[str, ...],
              min_ports: int, max_ports: int, protocols: tuple[str, ...], namespace: str,
              affinity: bool | None) -> dict[str, Any]:
    stack = draw(st.sampled_from(stacks))
    kind = draw(st.sampled_from(types))
    common = tuple(p for p in protocols if p != "SCTP") or protocols
    protos = protocols if draw(st.integers(0, 9)) == 0 else common
    ports = draw(_ports(index, min_ports, max_ports, kind != "ClusterIP", protos))
    spec: dict[str, Any] = {
        "type": kind,
        "clusterIPs": [_ip(_version(f), "10.96.0.0", "fd00:10:96::", index) for f in stack],
        "ports": ports,
    }
    spec["clusterIP"] = spec["clusterIPs"][0]
    if draw(st.booleans()):
        spec["externalIPs"] = [_ip(_version(f), "192.168.99.0", "2001:db8:99::", index) for f in stack]
    if draw(st.integers(0, 2)) == 0:
        spec["internalTrafficPolicy"] = "Local"
    if kind != "ClusterIP" or "externalIPs" in spec:
        spec["externalTrafficPolicy"] = draw(st.sampled_from(["Cluster", "Local"]))
    if affinity or (affinity is None and draw(st.integers(0, 2)) == 0):
        spec["sessionAffinity"] = "ClientIP"
        timeout = draw(st.sampled_from([None, 1, 10, 10800]))
        if timeout is not None:
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": timeout}}
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Service",
                            "metadata": {"namespace": namespace, "name": f"svc{index}"}, "spec": spec}
    if kind == "LoadBalancer":
        if spec.get("externalTrafficPolicy") == "Local":
            spec["healthCheckNodePort"] = 32000 + index
        if draw(st.booleans()):
            spec["loadBalancerSourceRanges"] = draw(st.sampled_from(
                [["203.0.113.0/25"], ["203.0.113.128/25", "10.244.0.0/16"], ["198.51.100.0/24"],
                 ["2001:db8:203::/80", "203.0.113.0/26"]]))
        if draw(st.integers(0, 4)):
            ingress = [{"ip": _ip(_version(f), "198.51.100.0", "2001:db8:100::", index)} for f in stack]
            body["status"] = {"loadBalancer": {"ingress": ingress}}
    return body


def _service_port_names(service: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p.get("name", ""), p.get("protocol", "TCP")) for p in service["spec"]["ports"]]


def _pod_ips(cidr: str, count: int = 4) -> list[str]:
    net = ipaddress.ip_network(cidr, strict=False)
    return [str(net.network_address + i) for i in range(2, 2 + count)]


def endpoint_slices(
    service: dict[str, Any],
    *,
    node: NodeSpec | None = None,
    min_endpoints: int = 0,
    max_endpoints: int = 4,
    max_slices: int = 3,
) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Lists of EndpointSlice dicts for ``service`` (a dict from :func:`services`).

    Slices are of the Service's families; each names some of its ports (a port no slice names
    has no endpoints), with numbers that may differ between slices (named ports resolving to
    different numbers per endpoint). Endpoints run on ``node``, on :data:`REMOTE_NODE` or on
    no node, with mixed conditions, and may be repeated across slices.

    Args:
        service: the Service the slices belong to.
        node: the node under test (default :class:`NodeSpec`'s); its local pod CIDR holds the
            local endpoints.
        min_endpoints, max_endpoints: endpoints per slice (0..16).
        max_slices: slices per family (0..8); 0 always gives ``[]``.

    Raises:
        InvalidArgument: a malformed ``service`` or a bound out of range (naming it).
    """
    spec = service.get("spec") if isinstance(service, dict) else None
    cluster_ips = _cluster_ips(spec) if isinstance(spec, dict) else []
    if not isinstance(spec, dict) or not spec.get("ports") or not cluster_ips:
        raise InvalidArgument(
            f"service must be a Service dict with spec.ports and spec.clusterIPs (or spec.clusterIP), "
            f"got {service!r}")
    for ip in cluster_ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise InvalidArgument(f"service: spec.clusterIPs holds {ip!r}, not an IP address") from None
    _check_bounds("min_endpoints", min_endpoints, "max_endpoints", max_endpoints, ceiling=16)
    _check_bounds("max_slices", max_slices, "max_slices", max_slices, ceiling=8)
    spec_node = node or NodeSpec()
    if not isinstance(spec_node, NodeSpec):
        raise InvalidArgument(f"node must be a NodeSpec, got {node!r}")
    return _slices(service, tuple(cluster_ips), spec_node, min_endpoints, max_endpoints, max_slices)


def _cluster_ips(spec: dict[str, Any]) -> list[str]:
    """``spec.clusterIPs``, else ``[spec.clusterIP]`` (a Service written before dual-stack); not ``None``."""
    ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    return [ip for ip in ips if isinstance(ip, str) and ip != "None"]


@st.composite
def _slices(draw: st.DrawFn, service: dict[str, Any], cluster_ips: tuple[str, ...], node: NodeSpec,
            min_eps: int, max_eps: int, max_slices: int) -> list[dict[str, Any]]:
    meta = service["metadata"]
    ports = _service_port_names(service)
    out: list[dict[str, Any]] = []
    for cluster_ip in cluster_ips:
        version = ipaddress.ip_address(cluster_ip).version
        local = node.local_pod_cidr(version)
        pools = {node.hostname: _pod_ips(local) if local else [],
                 REMOTE_NODE: _pod_ips(_REMOTE_PODS[version])}
        count = draw(st.integers(min_value=0, max_value=max_slices))
        for s in range(count):
            named = draw(st.lists(st.sampled_from(ports), unique=True, min_size=1, max_size=len(ports)))
            endpoints = []
            for _ in range(draw(st.integers(min_value=min_eps, max_value=max_eps))):
                where = draw(st.sampled_from([node.hostname, REMOTE_NODE, None]))
                pool = pools[where] if where is not None else pools[REMOTE_NODE] + pools[node.hostname]
                if not pool:
                    pool = pools[REMOTE_NODE]
                ep: dict[str, Any] = {"addresses": [draw(st.sampled_from(pool))]}
                if where is not None:
                    ep["nodeName"] = where
                conditions = draw(st.sampled_from(_CONDITIONS))
                if conditions:
                    ep["conditions"] = dict(conditions)
                endpoints.append(ep)
            out.append({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"namespace": meta["namespace"], "name": f"{meta['name']}-v{version}-{s}",
                             "labels": {"kubernetes.io/service-name": meta["name"]}},
                "addressType": f"IPv{version}",
                "endpoints": endpoints,
                "ports": [{"name": name, "protocol": proto, "port": draw(st.sampled_from(_ENDPOINT_PORTS))}
                          for name, proto in named],
            })
    return out


def clusters(
    *,
    node: NodeSpec | None = None,
    min_services: int = 1,
    max_services: int = 4,
    families: Sequence[IPFamily] | None = None,
    types: Sequence[str] = _TYPES,
    max_ports: int = 3,
    max_endpoints: int = 4,
    max_slices: int = 3,
    protocols: Sequence[str] = ("TCP", "UDP", "SCTP"),
    session_affinity: bool | None = None,
) -> st.SearchStrategy[Cluster]:
    """Consistent clusters: Services from :func:`services` with their slices from :func:`endpoint_slices`.

    Args:
        node: the node under test (default :class:`NodeSpec`).
        min_services, max_services: how many Services (0..200).
        families: the families Services may use (default: the node's).
        types, max_ports, protocols, session_affinity: passed to :func:`services`.
        max_endpoints, max_slices: passed to :func:`endpoint_slices`.

    Raises:
        InvalidArgument: a bound out of range or an unknown value (naming it).
    """
    spec = node or NodeSpec()
    if not isinstance(spec, NodeSpec):
        raise InvalidArgument(f"node must be a NodeSpec, got {node!r}")
    _check_bounds("min_services", min_services, "max_services", max_services, ceiling=MAX_SERVICES)
    fams = _check_families(spec.families if families is None else families)
    # Build one strategy now, so that bad arguments fail here and not at draw time.
    services(families=fams, types=types, max_ports=max_ports, protocols=protocols,
             session_affinity=session_affinity)
    _check_bounds("max_endpoints", max_endpoints, "max_endpoints", max_endpoints, ceiling=16)
    _check_bounds("max_slices", max_slices, "max_slices", max_slices, ceiling=8)
    return _clusters(spec, min_services, max_services, fams, tuple(types), max_ports, max_endpoints,
                     max_slices, tuple(protocols), session_affinity)


@st.composite
def _clusters(draw: st.DrawFn, node: NodeSpec, min_services: int, max_services: int,
              families: tuple[IPFamily, ...], types: tuple[str, ...], max_ports: int, max_endpoints: int,
              max_slices: int, protocols: tuple[str, ...], affinity: bool | None) -> Cluster:
    docs: list[dict[str, Any]] = []
    for index in range(draw(st.integers(min_value=min_services, max_value=max_services))):
        svc = draw(services(index=index, families=families, types=types, max_ports=max_ports,
                            protocols=protocols, session_affinity=affinity))
        docs.append(svc)
        docs.extend(draw(endpoint_slices(svc, node=node, max_endpoints=max_endpoints, max_slices=max_slices)))
    return Cluster(manifests=tuple(docs), node=node)


# -- packets -----------------------------------------------------------------------------------


def _node_source(node: NodeSpec, version: int) -> str:
    return node.node_ip(version) or ("192.0.2.2" if version == 4 else "2001:db8:ffff::2")


_Aim = tuple[Target, str, int, Protocol, ServicePortInfo | None]


def _targets(cluster: Cluster, version: int) -> list[_Aim]:
    """Every ``(target, dst, dport, protocol, info)`` worth sending to in ``version``."""
    out: list[_Aim] = []
    node_ip = _node_source(cluster.node, version)
    by_ip: dict[str, set[tuple[int, Protocol]]] = {}
    for info in cluster.snapshot:
        if (6 if info.family is IPFamily.IPv6 else 4) != version:
            continue
        by_ip.setdefault(info.cluster_ip, set()).add((info.port, info.protocol))
        out.append((Target.CLUSTER_IP, info.cluster_ip, info.port, info.protocol, info))
        if info.node_port:
            out.append((Target.NODE_PORT, node_ip, info.node_port, info.protocol, info))
        out += [(Target.EXTERNAL_IP, ip, info.port, info.protocol, info) for ip in info.external_ips]
        out += [(Target.LOAD_BALANCER, ip, info.port, info.protocol, info) for ip in info.load_balancer_ips]
    for ip, used in sorted(by_ip.items()):
        candidates = ((81, Protocol.TCP), (53, Protocol.UDP), (80, Protocol.UDP), (65534, Protocol.TCP))
        for port, proto in candidates:
            if (port, proto) not in used:
                out.append((Target.UNKNOWN_PORT, ip, port, proto, None))
                break
    out.append((Target.UNKNOWN_PORT, node_ip, 29999, Protocol.TCP, None))
    out += [(Target.UNKNOWN_IP, ip, 80, Protocol.TCP, None) for ip in _UNKNOWN_IPS[version]]
    return out


def _sources(cluster: Cluster, version: int, origin: Origin) -> list[str]:
    node = cluster.node
    if origin is Origin.NODE:
        return [_node_source(node, version)]
    if origin is Origin.LOCALHOST:
        return ["127.0.0.1" if version == 4 else "::1"]
    if origin is Origin.LOCAL_POD:
        local = node.local_pod_cidr(version)
        return _pod_ips(local, 5) if local else []   # the first four are endpoint IPs: hairpins
    if origin is Origin.REMOTE_POD:
        return _pod_ips(_REMOTE_PODS[version], 5)
    net = ipaddress.ip_network(_EXTERNAL[version])
    # Inside and outside the source ranges the strategies use (203.0.113.0/25 and /26).
    return [str(net.network_address + n) for n in (2, 100, 130, 250)]


def packets(
    cluster: Cluster,
    *,
    origins: Sequence[Origin] = tuple(Origin),
    targets: Sequence[Target] = tuple(Target),
) -> st.SearchStrategy[Packet]:
    """First packets of connections to ``cluster``'s node, of every family the node proxies.

    Targets: each service port's ClusterIP, NodePort (on the node IP, or on ``127.0.0.1``
    from localhost), external and load-balancer IPs, a port no Service uses on a ClusterIP
    and on the node, and addresses no Service uses. Origins: a pod on this node (including
    the endpoints themselves: hairpin traffic), a pod on another node, the node itself,
    localhost (only to the node's own addresses, as the kernel would pick the node IP
    otherwise), and external clients inside and outside the source ranges
    :func:`services` draws.

    Args:
        cluster: the cluster.
        origins, targets: restrict what is drawn; a target kind the cluster lacks is skipped.

    Raises:
        InvalidArgument: ``cluster`` is not a Cluster, an unknown origin or target, or no
            packet is possible with these restrictions (naming the argument).
    """
    if not isinstance(cluster, Cluster):
        raise InvalidArgument(f"cluster must be a kproxy.testing.Cluster, got {type(cluster).__name__}")
    try:
        wanted_origins = tuple(Origin(o) for o in origins)
        wanted_targets = frozenset(Target(t) for t in targets)
    except ValueError as err:
        raise InvalidArgument(f"origins/targets: {err}") from None
    choices: list[tuple[Origin, str, Target, str, int, Protocol]] = []
    for family in cluster.node.families:
        version = _version(family)
        found = [t for t in _targets(cluster, version) if t[0] in wanted_targets]
        for origin in wanted_origins:
            for src in _sources(cluster, version, origin):
                for target, dst, dport, proto, _ in found:
                    if origin is Origin.LOCALHOST:
                        on_node = dst == _node_source(cluster.node, version)
                        if target is not Target.NODE_PORT and not (target is Target.UNKNOWN_PORT and on_node):
                            continue
                        if version == 6 and target is Target.NODE_PORT:
                            continue  # kube-proxy never serves NodePorts on ::1
                        dst = src
                    choices.append((origin, src, target, dst, dport, proto))
    if not choices:
        raise InvalidArgument(f"no packet is possible for origins={origins!r} and targets={targets!r} "
                              f"in {cluster!r}; widen them")
    return st.builds(
        lambda c, sport: Packet(src=c[1], dst=c[3], sport=sport, dport=c[4], protocol=c[5], origin=c[0],
                                target=c[2]),
        st.sampled_from(choices),
        st.sampled_from([40000, 1024, 65535]) | st.integers(min_value=1024, max_value=65535),
    )
