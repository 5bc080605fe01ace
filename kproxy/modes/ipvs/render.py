"""A pure function from a Snapshot to the ipvs mode's desired state (:class:`IpvsState`).

One pass over the service ports, in the order of kube-proxy's ``syncProxyRules``
(``pkg/proxy/ipvs/proxier.go``), for each port:

1. its local endpoints (all of them, whatever their conditions) go into ``KUBE-LOOP-BACK`` as
   ``ip,proto:port,ip`` (hairpin masquerade);
2. the ClusterIP: ``KUBE-CLUSTER-IP``, a bound virtual server whose real servers are the
   internal endpoints (``syncEndpoint(onlyNodeLocal=InternalPolicyLocal)``);
3. each external IP: ``KUBE-EXTERNAL-IP`` (or ``-LOCAL`` with externalTrafficPolicy=Local), a
   virtual server bound unless the address is a node address;
4. each load-balancer IP: ``KUBE-LOAD-BALANCER`` (+ ``-LOCAL``, ``-FW``, ``-SOURCE-CIDR`` per
   source range, ``-SOURCE-IP`` when a range holds the node IP, else an entry for the
   ``KUBE-IPVS-OUT-FILTER`` rule), a virtual server bound unless a node address;
5. the NodePort (skipped with the rest of the port when no node IP qualifies): the port in
   ``KUBE-NODE-PORT-TCP``/``-UDP`` (``nodeIP,sctp:port`` per node IP for SCTP), the ``-LOCAL``
   set with externalTrafficPolicy=Local, one unbound virtual server per node IP;
6. the health check node port in ``KUBE-HEALTH-CHECK-NODE-PORT``.

``KUBE-IPVS-IPS`` is the set of bound addresses. External virtual servers take the external
endpoints. ``syncEndpoint`` falls back to the cluster endpoints when a Local policy finds no
local endpoint (kubernetes PR 97081), which the snapshot's categorisation leaves empty for an
internal-only Local port. Every virtual server gets ``FLAG_PERSISTENT`` and the Service's
affinity timeout with ClientIP affinity, and ``FLAG_SOURCE_HASH`` with the ``mh`` scheduler.
"""

from __future__ import annotations

import ipaddress

from kproxy.model.snapshot import Endpoint, ServicePortInfo, Snapshot
from kproxy.modes.ipvs import names as n
from kproxy.modes.ipvs.config import IpvsConfig
from kproxy.modes.ipvs.state import (
    FLAG_PERSISTENT,
    FLAG_SOURCE_HASH,
    IpsetEntries,
    IpvsState,
    RealServer,
    VirtualServer,
)

__all__ = ["render_state"]

_NODE_PORT_SETS = {
    "tcp": (n.NODE_PORT_TCP, n.NODE_PORT_LOCAL_TCP),
    "udp": (n.NODE_PORT_UDP, n.NODE_PORT_LOCAL_UDP),
    "sctp": (n.NODE_PORT_SCTP, n.NODE_PORT_LOCAL_SCTP),
}


class _Builder:
    """The accumulating state of one render (private; the result is frozen)."""

    def __init__(self, config: IpvsConfig) -> None:
        self.config = config
        self.sets: dict[str, set[str]] = {s.name: set() for s in n.SET_SPECS}
        self.servers: list[VirtualServer] = []
        self.bound: set[str] = set()
        self.no_node_access: list[tuple[str, str, int]] = []
        self.node_addresses = frozenset(config.node_addresses)

    def add(self, set_name: str, entry: str) -> None:
        self.sets[set_name].add(entry)

    def server(self, svc: ServicePortInfo, address: str, port: int, kind: str,
               endpoints: tuple[Endpoint, ...], *, bind: bool) -> None:
        flags, timeout = 0, 0
        if svc.session_affinity_timeout_s is not None:
            flags |= FLAG_PERSISTENT
            timeout = svc.session_affinity_timeout_s
        if self.config.scheduler == "mh":
            flags |= FLAG_SOURCE_HASH
        reals = tuple(RealServer(address=e.ip, port=e.port)
                      for e in sorted({(_ip_key(e.ip), e.port): e for e in endpoints}.values(),
                                      key=lambda e: (_ip_key(e.ip), e.port)))
        self.servers.append(VirtualServer(
            address=address, port=port, protocol=str(svc.protocol), scheduler=self.config.scheduler,
            flags=flags, timeout_s=timeout, real_servers=reals, service=str(svc.name), kind=kind,
            bind=bind))
        if bind:
            self.bound.add(address)


def _ip_key(ip: str) -> tuple[int, int]:
    addr = ipaddress.ip_address(ip)
    return (addr.version, int(addr))


def _canonical(ip: str) -> str:
    return str(ipaddress.ip_address(ip))


def _endpoints(svc: ServicePortInfo, only_local: bool) -> tuple[Endpoint, ...]:
    """``syncEndpoint``'s choice: local endpoints when asked and there are some, else cluster ones."""
    if only_local and svc.local_endpoints:
        return svc.local_endpoints
    return svc.cluster_endpoints


def _loop_back(b: _Builder, svc: ServicePortInfo, proto: str) -> None:
    for e in svc.endpoints:
        if e.is_local and e.ip and e.port:
            b.add(n.LOOP_BACK, f"{e.ip},{proto}:{e.port},{e.ip}")


def _cluster_ip(b: _Builder, svc: ServicePortInfo, proto: str) -> None:
    b.add(n.CLUSTER_IP, f"{svc.cluster_ip},{proto}:{svc.port}")
    b.server(svc, svc.cluster_ip, svc.port, "cluster-ip", _endpoints(svc, svc.internal_policy_local),
             bind=True)


def _external_ips(b: _Builder, svc: ServicePortInfo, proto: str) -> None:
    for raw in svc.external_ips:
        ip = _canonical(raw)
        b.add(n.EXTERNAL_IP_LOCAL if svc.external_policy_local else n.EXTERNAL_IP, f"{ip},{proto}:{svc.port}")
        b.server(svc, ip, svc.port, "external-ip", _endpoints(svc, svc.external_policy_local),
                 bind=ip not in b.node_addresses)


def _load_balancer_ips(b: _Builder, svc: ServicePortInfo, proto: str) -> None:
    node_ip = b.config.node_ip
    for raw in svc.load_balancer_ips:
        ip = _canonical(raw)
        entry = f"{ip},{proto}:{svc.port}"
        b.add(n.LOAD_BALANCER, entry)
        if svc.external_policy_local:
            b.add(n.LOAD_BALANCER_LOCAL, entry)
        if svc.load_balancer_source_ranges:
            b.add(n.LOAD_BALANCER_FW, entry)
            allow_node = False
            for cidr in svc.load_balancer_source_ranges:
                net = ipaddress.ip_network(cidr.strip(), strict=False)
                b.add(n.LOAD_BALANCER_SOURCE_CIDR, f"{entry},{net}")
                if node_ip is not None and ipaddress.ip_address(node_ip) in net:
                    allow_node = True
            if allow_node:
                b.add(n.LOAD_BALANCER_SOURCE_IP, f"{entry},{ip}")
            else:
                b.no_node_access.append((ip, proto, svc.port))
        b.server(svc, ip, svc.port, "load-balancer", _endpoints(svc, svc.external_policy_local),
                 bind=ip not in b.node_addresses)


def _node_port(b: _Builder, svc: ServicePortInfo, proto: str, node_ips: tuple[str, ...]) -> bool:
    """Step 5; False when kube-proxy skips the rest of this port (no node IP qualifies)."""
    if not svc.node_port:
        return True
    if not node_ips:
        return False
    common, local = _NODE_PORT_SETS[proto]
    entries = ([f"{ip},{proto}:{svc.node_port}" for ip in node_ips] if proto == "sctp"
               else [str(svc.node_port)])
    for entry in entries:
        b.add(common, entry)
        if svc.external_policy_local:
            b.add(local, entry)
    for ip in node_ips:
        b.server(svc, ip, svc.node_port, "node-port", _endpoints(svc, svc.external_policy_local), bind=False)
    return True


def render_state(snapshot: Snapshot, config: IpvsConfig) -> IpvsState:
    """The desired state of ``config.family`` for ``snapshot`` (see the module docstring).

    Service ports are walked sorted by ServicePortName (kube-proxy walks a Go map).
    """
    b = _Builder(config)
    node_ips = config.nodeport_ips
    ports = snapshot.family(config.family)
    for name in sorted(ports, key=str):
        svc = ports[name]
        proto = str(svc.protocol).lower()
        _loop_back(b, svc, proto)
        _cluster_ip(b, svc, proto)
        _external_ips(b, svc, proto)
        _load_balancer_ips(b, svc, proto)
        if not _node_port(b, svc, proto, node_ips):
            continue
        if svc.health_check_node_port:
            b.add(n.HEALTH_CHECK_NODE_PORT, str(svc.health_check_node_port))
    b.sets[n.IPVS_IPS] = set(b.bound)
    family = 6 if config.ipv6 else 4
    ipsets = tuple(
        IpsetEntries(name=n.set_name(s.name, config.ipv6), set_type=s.set_type, family=family,
                     comment=s.comment, entries=tuple(sorted(b.sets[s.name])))
        for s in n.SET_SPECS)
    return IpvsState(
        virtual_servers=tuple(b.servers),
        bound_addresses=tuple(sorted(b.bound, key=_ip_key)),
        ipsets=ipsets,
        lb_no_node_access=tuple(b.no_node_access),
    )
