"""The ipvs mode's configuration: kube-proxy's flags that change what its ipvs proxier programs.

Follows ``NewProxier`` in kube-proxy's ``pkg/proxy/ipvs/proxier.go``: the scheduler defaults to
``rr`` (``defaultScheduler``); the masquerade mark is ``fmt.Sprintf("%#08x", 1<<bit)``
(``0x00004000``); the local-traffic detector comes from ``--cluster-cidr`` (its first CIDR of the
rendered family); ``--nodeport-addresses`` selects the node IPs that get NodePort virtual servers
(``proxyutil.NewNodePortAddresses``: CIDRs of the other family are ignored, none left or a
``/0`` means every node address; ``primary`` means the family's first node IP). The node's
addresses are ``node_ips``: what kube-proxy reads with ``GetAllLocalAddressesExcept("kube-ipvs0")``
(loopback and link-local left out).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

from emulation.ipvs import SCHEDULERS
from kproxy.config.defaults import DEFAULT_IPVS_SCHEDULER, DEFAULT_MASQUERADE_BIT
from kproxy.config.run import RunConfig
from kproxy.errors import ConfigError
from kproxy.model.names import IPFamily

__all__ = ["DEFAULT_SCHEDULER", "IpvsConfig"]

#: kube-proxy's ``defaultScheduler``.
DEFAULT_SCHEDULER = DEFAULT_IPVS_SCHEDULER
_PRIMARY = "primary"


def _network(value: str, what: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ConfigError(f"{what}: expected a CIDR such as 10.0.0.0/8, got {value!r}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class IpvsConfig:
    """kube-proxy's settings that shape the ipvs mode's IPVS table, ipsets and iptables rules.

    Attributes:
        family: the IP family rendered (kube-proxy runs one ipvs proxier per family).
        node_ips: the node's addresses (any family, loopback ignored); the first of a family is
            its primary IP (``proxier.nodeIP``, used for load-balancer source ranges).
        cluster_cidr: ``--cluster-cidr``; the first of the family enables the local-traffic
            detector (``! -s CIDR`` on the KUBE-CLUSTER-IP masquerade rule).
        masquerade_all: ``--masquerade-all``.
        masquerade_bit: ``--iptables-masquerade-bit`` (0..31, default 14).
        nodeport_addresses: ``--nodeport-addresses`` CIDRs, or ``("primary",)``; empty: every
            node address.
        scheduler: ``--ipvs-scheduler`` (default ``rr``); any scheduler the emulator models.
        random_fully: iptables supports ``MASQUERADE --random-fully``.

    Raises:
        ConfigError: a bad address, CIDR, bit or scheduler.
    """

    family: IPFamily = IPFamily.IPv4
    node_ips: tuple[str, ...] = ()
    cluster_cidr: tuple[str, ...] = ()
    masquerade_all: bool = False
    masquerade_bit: int = DEFAULT_MASQUERADE_BIT
    nodeport_addresses: tuple[str, ...] = ()
    scheduler: str = DEFAULT_SCHEDULER
    random_fully: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.family, IPFamily):
            raise ConfigError(f"family: expected IPFamily.IPv4 or IPFamily.IPv6, got {self.family!r}")
        if not 0 <= self.masquerade_bit <= 31:
            raise ConfigError(f"masquerade_bit: expected 0..31, got {self.masquerade_bit=}")
        if not self.scheduler:
            object.__setattr__(self, "scheduler", DEFAULT_SCHEDULER)
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(f"--ipvs-scheduler: expected one of {', '.join(sorted(SCHEDULERS))}, "
                              f"got {self.scheduler!r}")
        for ip in self.node_ips:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ConfigError(f"node_ips: expected IP addresses, got {ip!r}") from None
        for cidr in self.cluster_cidr:
            _network(cidr, "cluster_cidr")
        if _PRIMARY in self.nodeport_addresses and len(self.nodeport_addresses) > 1:
            raise ConfigError("nodeport_addresses: 'primary' must be the only value, "
                              f"got {self.nodeport_addresses!r}")
        for cidr in self.nodeport_addresses:
            if cidr != _PRIMARY:
                _network(cidr, "nodeport_addresses")

    @classmethod
    def from_run(cls, run: RunConfig, family: IPFamily | None = None) -> IpvsConfig:
        """The ipvs settings of a run configuration, rendering ``family`` (default: the primary).

        kube-proxy's ipvs proxier masquerades with the same mark and local-traffic detector as
        the iptables one, so it reads the same rule settings plus ``--ipvs-scheduler``.

        Raises:
            ConfigError: never for a configuration :func:`~kproxy.config.build_run_config` built.
        """
        rules = run.rules
        return cls(family=family or run.primary_family, node_ips=run.node.node_ips,
                   cluster_cidr=rules.cluster_cidrs, masquerade_all=rules.masquerade_all,
                   masquerade_bit=rules.masquerade_bit, nodeport_addresses=rules.nodeport_addresses,
                   scheduler=rules.ipvs_scheduler)

    def for_family(self, family: IPFamily) -> IpvsConfig:
        """This configuration rendering ``family`` instead."""
        return self if family is self.family else replace(self, family=family)

    @property
    def ipv6(self) -> bool:
        """Rendering IPv6."""
        return self.family is IPFamily.IPv6

    @property
    def mark(self) -> str:
        """The masquerade mark as kube-proxy's ipvs proxier writes it (``%#08x``: ``0x00004000``)."""
        return "0x%08x" % (1 << self.masquerade_bit)

    @property
    def local_cidr(self) -> str | None:
        """The family's pod CIDR (the local-traffic detector), or None."""
        for cidr in self.cluster_cidr:
            net = _network(cidr, "cluster_cidr")
            if (net.version == 6) == self.ipv6:
                return str(net)
        return None

    @property
    def node_addresses(self) -> tuple[str, ...]:
        """The family's node addresses, canonical, loopback and link-local left out, in order."""
        out: list[str] = []
        for ip in self.node_ips:
            addr = ipaddress.ip_address(ip)
            if (addr.version == 6) != self.ipv6 or addr.is_loopback or addr.is_link_local:
                continue
            if str(addr) not in out:
                out.append(str(addr))
        return tuple(out)

    @property
    def node_ip(self) -> str | None:
        """The family's primary node IP (``proxier.nodeIP``), or None."""
        addrs = self.node_addresses
        return addrs[0] if addrs else None

    @property
    def nodeport_ips(self) -> tuple[str, ...]:
        """The addresses that get one virtual server per NodePort (see the module docstring)."""
        addrs = self.node_addresses
        if self.nodeport_addresses == (_PRIMARY,):
            return addrs[:1]
        nets = [n for n in (_network(c, "nodeport_addresses") for c in self.nodeport_addresses)
                if (n.version == 6) == self.ipv6]
        if not nets or any(n.prefixlen == 0 for n in nets):
            return addrs
        return tuple(a for a in addrs if any(ipaddress.ip_address(a) in n for n in nets))
