"""What the ipvs mode programs, as values: virtual servers, real servers, ipset entries.

:class:`IpvsState` is the desired state of one IP family after one ``syncProxyRules`` of
kube-proxy's ipvs proxier (``pkg/proxy/ipvs/proxier.go``); :mod:`kproxy.modes.ipvs.render`
computes it and :mod:`kproxy.modes.ipvs.text` prints it in the kernel tools' formats.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FLAG_PERSISTENT", "FLAG_SOURCE_HASH", "IpsetEntries", "IpvsState", "RealServer", "VirtualServer"]

#: ``utilipvs.FlagPersistent`` (kernel ``IP_VS_SVC_F_PERSISTENT``).
FLAG_PERSISTENT = 0x1
#: ``utilipvs.FlagSourceHash`` (kernel ``IP_VS_SVC_F_SCHED2``: ``mh-port`` / ``sh-port``).
FLAG_SOURCE_HASH = 0x10


@dataclass(frozen=True, slots=True, kw_only=True)
class RealServer:
    """A destination (``utilipvs.RealServer``): ``address``, ``port`` and ``weight`` (kube-proxy
    always asks for weight 1; 0 only while gracefully terminating)."""

    address: str
    port: int
    weight: int = 1

    @property
    def label(self) -> str:
        """``ip:port`` (``[ip6]:port``)."""
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualServer:
    """A virtual server (``utilipvs.VirtualServer``) and the real servers kube-proxy wants in it.

    Attributes:
        address, port, protocol: the service address (``TCP``, ``UDP`` or ``SCTP``).
        scheduler: the scheduler name.
        flags: ``FLAG_PERSISTENT`` with ClientIP affinity; ``FLAG_SOURCE_HASH`` with ``mh``.
        timeout_s: the persistence timeout (the Service's affinity timeout), 0 without affinity.
        real_servers: the endpoints, sorted by address then port (kube-proxy adds them in Go
            map order, which is random).
        service: the ServicePortName it serves (``ns/name:port``).
        kind: ``cluster-ip``, ``external-ip``, ``load-balancer`` or ``node-port``.
        bind: the address goes on ``kube-ipvs0``.
    """

    address: str
    port: int
    protocol: str
    scheduler: str
    flags: int = 0
    timeout_s: int = 0
    real_servers: tuple[RealServer, ...] = ()
    service: str = ""
    kind: str = "cluster-ip"
    bind: bool = True

    @property
    def key(self) -> tuple[str, int, str]:
        """``(address, port, protocol)``: what identifies it in the kernel."""
        return (self.address, self.port, self.protocol)

    @property
    def label(self) -> str:
        """``TCP 10.0.0.1:80`` as ``ipvsadm`` names it."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.protocol} {host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class IpsetEntries:
    """One of kube-proxy's sets: its kernel ``name``, ``set_type``, ``family`` (4 or 6),
    ``comment`` and sorted ``entries`` (as ``ipset`` writes them, ``utilipset.Entry.String``)."""

    name: str
    set_type: str
    family: int
    comment: str
    entries: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class IpvsState:
    """The desired IPVS and ipset state of one family.

    Attributes:
        virtual_servers: every virtual server, in render order (services sorted by name).
        bound_addresses: the addresses on ``kube-ipvs0`` (``activeBindAddrs``), sorted.
        ipsets: every set of ``ipsetInfo``, in its order (empty ones included).
        lb_no_node_access: ``(lb_ip, protocol, port)`` of load-balancer IPs whose source
            ranges leave the node IP out (``lbNoNodeAccessIPPortProtocolEntries``).
    """

    virtual_servers: tuple[VirtualServer, ...]
    bound_addresses: tuple[str, ...]
    ipsets: tuple[IpsetEntries, ...]
    lb_no_node_access: tuple[tuple[str, str, int], ...] = ()

    def ipset(self, name: str) -> IpsetEntries:
        """The set with this kernel name.

        Raises:
            KeyError: no such set.
        """
        for s in self.ipsets:
            if s.name == name:
                return s
        raise KeyError(name)
