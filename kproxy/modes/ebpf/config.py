"""The ebpf mode's settings: the node's NodePort addresses and Cilium's load-balancing flags."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from kproxy.config import RunConfig
from kproxy.config.defaults import DEFAULT_BPF_LB_ALGORITHM
from kproxy.errors import ConfigError
from kproxy.model import IPFamily
from kproxy.modes.ebpf.layout import LBAlgorithm
from kproxy.modes.ebpf.maglev import MaglevConfig

__all__ = ["ANNOTATION_LB_ALGORITHM", "ANNOTATION_SRC_RANGES_POLICY", "EbpfConfig"]

#: Cilium's per-Service algorithm annotation (``annotation.ServiceLoadBalancingAlgorithm``).
ANNOTATION_LB_ALGORITHM = "service.cilium.io/lb-algorithm"
#: Cilium's source-range policy annotation: ``deny`` inverts ``loadBalancerSourceRanges``.
ANNOTATION_SRC_RANGES_POLICY = "service.cilium.io/src-ranges-policy"

_PRIMARY = "primary"


@dataclass(frozen=True, slots=True, kw_only=True)
class EbpfConfig:
    """What the ebpf mode's renderer reads besides the Snapshot.

    Attributes:
        node_ips: the node's addresses (any family); NodePort frontends are expanded over those
            of each family, as Cilium's ``NodeAddressNodePortIndex`` addresses.
        nodeport_addresses: ``--nodeport-addresses`` CIDRs or ``("primary",)`` narrowing them
            (empty: every node address).
        algorithm: ``--bpf-lb-algorithm`` (``random`` or ``maglev``).
        maglev: the Maglev table size and seed.

    Raises:
        ConfigError: an unknown algorithm, or a bad node address or CIDR.
    """

    node_ips: tuple[str, ...] = ()
    nodeport_addresses: tuple[str, ...] = ()
    algorithm: str = DEFAULT_BPF_LB_ALGORITHM
    maglev: MaglevConfig = field(default_factory=MaglevConfig)

    def __post_init__(self) -> None:
        if self.algorithm not in ("random", "maglev"):
            raise ConfigError(f"--bpf-lb-algorithm: expected random or maglev, got {self.algorithm!r}")
        for ip in self.node_ips:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ConfigError(f"node_ips: expected IP addresses, got {ip!r}") from None
        for cidr in self.nodeport_addresses:
            if cidr != _PRIMARY:
                _network(cidr)

    @classmethod
    def from_run(cls, run: RunConfig) -> EbpfConfig:
        """The ebpf settings of a run configuration.

        Raises:
            ConfigError: never for a configuration :func:`~kproxy.config.build_run_config` built.
        """
        rules = run.rules
        return cls(node_ips=run.node.node_ips, nodeport_addresses=rules.nodeport_addresses,
                   algorithm=rules.bpf_lb_algorithm,
                   maglev=MaglevConfig(table_size=rules.bpf_lb_maglev_table_size,
                                       hash_seed=rules.bpf_lb_maglev_hash_seed))

    @property
    def default_algorithm(self) -> LBAlgorithm:
        """The datapath's compiled default (``LB_SELECTION``)."""
        return LBAlgorithm.MAGLEV if self.algorithm == "maglev" else LBAlgorithm.RANDOM

    def nodeport_ips(self, family: IPFamily) -> tuple[str, ...]:
        """The family's node addresses NodePort frontends are expanded over (canonical,
        loopback and link-local left out, in order), narrowed by ``--nodeport-addresses``."""
        v6 = family is IPFamily.IPv6
        addrs: list[str] = []
        for ip in self.node_ips:
            addr = ipaddress.ip_address(ip)
            if (addr.version == 6) != v6 or addr.is_loopback or addr.is_link_local:
                continue
            if str(addr) not in addrs:
                addrs.append(str(addr))
        if self.nodeport_addresses == (_PRIMARY,):
            return tuple(addrs[:1])
        nets = [n for n in map(_network, (c for c in self.nodeport_addresses if c != _PRIMARY))
                if (n.version == 6) == v6]
        if not nets:
            return tuple(addrs)
        return tuple(a for a in addrs if any(ipaddress.ip_address(a) in n for n in nets))


def _network(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise ConfigError(f"--nodeport-addresses: expected CIDRs, got {cidr!r}") from None
