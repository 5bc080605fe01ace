"""The nftables mode's configuration, resolved for one IP family as kube-proxy's ``NewProxier`` does.

:class:`NftablesConfig` holds the flags that shape the transaction. :func:`family_context`
resolves it once per render: the ``ip``/``ip6`` words and address type, the masquerade mark,
the local-traffic detector (``IfLocalNFT``/``IfNotLocalNFT`` of ``proxyutil.DetectLocalByCIDR``),
the node IPs accepting NodePorts and the ``--service-cidr`` ranges of the family.

NodePort addresses follow ``proxyutil.NewNodePortAddresses``: CIDRs of the other family are
ignored; none left, or a zero CIDR, matches every local address (``fib daddr type local``
without loopback); ``primary`` (kube-proxy's nftables default since 1.31) is the node's first IP
of the family. Loopback addresses never accept NodePorts in this mode (KEP-3866: no localhost
NodePorts, no ``route_localnet``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kproxy.errors import ConfigError
from kproxy.model.names import IPFamily

__all__ = ["NODEPORT_ADDRESSES_PRIMARY", "FamilyContext", "NftablesConfig", "family_context"]

#: ``--nodeport-addresses primary``: the node's primary IP of each family.
NODEPORT_ADDRESSES_PRIMARY = "primary"


def _is_v6(text: str) -> bool:
    return ":" in text


def _network(value: str, what: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ConfigError(f"{what}: expected a CIDR such as 10.0.0.0/8, got {value!r}") from None


def _csv(value: str | Sequence[str]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(v.strip() for v in items if v.strip())


@dataclass(frozen=True, slots=True, kw_only=True)
class NftablesConfig:
    """kube-proxy's settings that shape the nftables transaction.

    Attributes:
        family: the IP family rendered (kube-proxy runs one proxier, and one table, per family).
        node_ips: the node's addresses, any family; the first of a family is its primary IP
            (``primary`` NodePort addresses, the LoadBalancer source-range allowance).
        cluster_cidr: ``--cluster-cidr``; the first CIDR of the family is the local detector
            (``ip saddr 10.0.0.0/8``). Empty: no detector.
        masquerade_all: ``--masquerade-all``.
        masquerade_bit: ``--iptables-masquerade-bit`` (kube-proxy reuses it), 0..31.
        masquerade_mark: the mark as written; None derives Go's ``%#08x`` of the bit
            (``0x00004000``); kube-proxy's tests use ``"0x4000"``.
        nodeport_addresses: ``--nodeport-addresses`` CIDRs, or ``("primary",)`` (the default).
        service_cidrs: ``--service-cidr CIDR[,CIDR]``; those of the family get the DROP rule
            for unallocated ClusterIPs.
    """

    family: IPFamily = IPFamily.IPv4
    node_ips: tuple[str, ...] = ()
    cluster_cidr: tuple[str, ...] = ()
    masquerade_all: bool = False
    masquerade_bit: int = 14
    masquerade_mark: str | None = None
    nodeport_addresses: tuple[str, ...] = (NODEPORT_ADDRESSES_PRIMARY,)
    service_cidrs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.family, IPFamily):
            raise ConfigError(f"family: expected IPFamily.IPv4 or IPFamily.IPv6, got {self.family!r}")
        if not 0 <= self.masquerade_bit <= 31:
            raise ConfigError(f"masquerade_bit: expected 0..31, got {self.masquerade_bit=}")
        if self.masquerade_mark is not None:
            try:
                int(self.masquerade_mark, 16)
            except ValueError:
                raise ConfigError(f"masquerade_mark: expected a hex mark such as 0x4000, "
                                  f"got {self.masquerade_mark!r}") from None
        for ip in self.node_ips:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ConfigError(f"node_ips: expected IP addresses, got {ip!r}") from None
        for cidr in self.cluster_cidr:
            _network(cidr, "cluster_cidr")
        for cidr in self.service_cidrs:
            _network(cidr, "service_cidrs (--service-cidr)")
        npa = self.nodeport_addresses
        if NODEPORT_ADDRESSES_PRIMARY in npa and len(npa) > 1:
            raise ConfigError(f"nodeport_addresses: 'primary' must be the only value, got {npa!r}")
        for cidr in npa:
            if cidr != NODEPORT_ADDRESSES_PRIMARY:
                _network(cidr, "nodeport_addresses (--nodeport-addresses)")

    @classmethod
    def from_run(
        cls, *, family: IPFamily = IPFamily.IPv4, node_ips: Sequence[str] = (),
        cluster_cidr: str | Sequence[str] = "", masquerade_all: bool = False, masquerade_bit: int = 14,
        nodeport_addresses: str | Sequence[str] = "", service_cidr: str | Sequence[str] = "",
    ) -> NftablesConfig:
        """Build from ``kproxy run``/``render`` flag values (comma-separated text or sequences).

        An empty ``nodeport_addresses`` means kube-proxy's nftables default, ``primary``.

        Raises:
            ConfigError: a value is malformed (the message names the flag).
        """
        npa = _csv(nodeport_addresses) or (NODEPORT_ADDRESSES_PRIMARY,)
        return cls(family=family, node_ips=tuple(node_ips), cluster_cidr=_csv(cluster_cidr),
                   masquerade_all=masquerade_all, masquerade_bit=masquerade_bit,
                   nodeport_addresses=npa, service_cidrs=_csv(service_cidr))

    @classmethod
    def kube_proxy_test_fake(cls, family: IPFamily = IPFamily.IPv4) -> NftablesConfig:
        """The settings of kube-proxy's nftables ``NewFakeProxier`` (its tests' expected rulesets).

        Node IPs 192.168.0.2, 192.168.1.2, 192.168.99.11, 2001:db8::1, 2001:db8:1::2; pods in
        10.0.0.0/8 (fd00:10::/64); mark ``0x4000``; NodePorts on 192.168.0.2/32 and
        2001:db8::1/128; service CIDRs 172.30.0.0/16 and fd00:10:96::/112.
        """
        return cls(
            family=family,
            node_ips=("192.168.0.2", "192.168.1.2", "192.168.99.11", "2001:db8::1", "2001:db8:1::2"),
            cluster_cidr=("10.0.0.0/8", "fd00:10::/64"), masquerade_mark="0x4000",
            nodeport_addresses=("192.168.0.2/32", "2001:db8::1/128"),
            service_cidrs=("172.30.0.0/16", "fd00:10:96::/112"),
        )

    def for_family(self, family: IPFamily) -> NftablesConfig:
        """This configuration rendering ``family`` instead."""
        return self if family is self.family else replace(self, family=family)

    @property
    def mark(self) -> str:
        """The masquerade mark as written."""
        if self.masquerade_mark is not None:
            return self.masquerade_mark
        return "0x%08x" % (1 << self.masquerade_bit)  # Go's %#08x pads the digits, not the 0x


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyContext:
    """An :class:`NftablesConfig` resolved for its family.

    Attributes:
        config: the configuration.
        ip: ``ip`` or ``ip6`` (the family word of the table and of address matches).
        addr_type: ``ipv4_addr`` or ``ipv6_addr``.
        no_localhost: ``ip daddr != 127.0.0.0/8`` or ``ip6 daddr != ::1``.
        if_local, if_not_local: the detector's match text, ``""`` without a detector.
        node_ip: the primary node IP of the family, or None.
        nodeport_ips: the addresses in ``nodeport-ips``; None when NodePorts match every
            local address.
        service_cidrs: the family's ``--service-cidr`` ranges joined by ``,`` (``""``: none).
    """

    config: NftablesConfig
    ip: str
    addr_type: str
    no_localhost: str
    if_local: str
    if_not_local: str
    node_ip: str | None
    nodeport_ips: tuple[str, ...] | None
    service_cidrs: str


def _nodeport_ips(config: NftablesConfig, ipv6: bool) -> tuple[str, ...] | None:
    raw = config.nodeport_addresses
    if raw == (NODEPORT_ADDRESSES_PRIMARY,):
        primary = next((ip for ip in config.node_ips if _is_v6(ip) == ipv6), None)
        raw = (primary + ("/128" if ipv6 else "/32"),) if primary else ()
    nets = [_network(c, "nodeport_addresses") for c in raw if _is_v6(c) == ipv6]
    if not nets or any(n.prefixlen == 0 for n in nets):
        return None
    addrs = {ipaddress.ip_address(ip) for ip in config.node_ips}
    return tuple(str(a) for a in sorted(a for a in addrs if a.version == (6 if ipv6 else 4)
                                        and not a.is_loopback and any(a in n for n in nets)))


def family_context(config: NftablesConfig) -> FamilyContext:
    """Resolve ``config`` for its family (see the module docstring)."""
    ipv6 = config.family is IPFamily.IPv6
    ip = "ip6" if ipv6 else "ip"
    cidr = next((c for c in config.cluster_cidr if _is_v6(c) == ipv6), None)
    cidr_text = str(_network(cidr, "cluster_cidr")) if cidr is not None else ""
    return FamilyContext(
        config=config, ip=ip, addr_type="ipv6_addr" if ipv6 else "ipv4_addr",
        no_localhost="ip6 daddr != ::1" if ipv6 else "ip daddr != 127.0.0.0/8",
        if_local=f"{ip} saddr {cidr_text}" if cidr_text else "",
        if_not_local=f"{ip} saddr != {cidr_text}" if cidr_text else "",
        node_ip=next((i for i in config.node_ips if _is_v6(i) == ipv6), None),
        nodeport_ips=_nodeport_ips(config, ipv6),
        service_cidrs=",".join(str(_network(c, "service_cidrs")) for c in config.service_cidrs
                               if _is_v6(c) == ipv6),
    )
