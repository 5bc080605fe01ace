"""The iptables mode's configuration, and what it means for one IP family.

:class:`IptablesConfig` holds kube-proxy's flags that change the rules. :func:`family_context`
resolves it for one IP family once per render (the masquerade mark text, the local-traffic
detector, the NodePort destinations, the localhost NodePort switch), as kube-proxy's
``NewProxier`` does when it builds a single-family proxier.

NodePort addresses (``--nodeport-addresses``) follow ``proxyutil.NodePortAddresses``: CIDRs of
the other family are ignored; none left (kube-proxy's default for the iptables mode) means
every local address, matched with ``-m addrtype --dst-type LOCAL``; otherwise one rule per
local address inside a CIDR. ``primary`` means the node's first IP of each family (``/32`` or
``/128``), the nftables mode's default since 1.31 and an opt-in for iptables. The node's local
addresses are ``node_ips`` plus loopback (``127.0.0.1``, ``::1``), which every node has.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

from kproxy.config.defaults import DEFAULT_LOCALHOST_NODEPORTS, DEFAULT_MASQUERADE_BIT
from kproxy.config.run import RunConfig
from kproxy.errors import ConfigError
from kproxy.model.names import IPFamily

__all__ = ["NODEPORT_ADDRESSES_PRIMARY", "FamilyContext", "IptablesConfig", "family_context"]

#: The special ``--nodeport-addresses`` value meaning "the node's primary IPs".
NODEPORT_ADDRESSES_PRIMARY = "primary"

_IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _is_v6(text: str) -> bool:
    return ":" in text


def _network(value: str, what: str) -> _IPNetwork:
    try:
        return ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ConfigError(f"{what}: expected a CIDR such as 10.0.0.0/8, got {value!r}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class IptablesConfig:
    """kube-proxy's settings that shape the iptables rules.

    Attributes:
        family: the IP family rendered (kube-proxy runs one proxier per family).
        node_ips: the node's addresses, any family; the first of a family is its primary IP
            (used for ``primary`` NodePort addresses and the load-balancer source-range rule).
        cluster_cidr: ``--cluster-cidr`` values; the first of the rendered family enables
            local-traffic detection (``-s``/``! -s`` it). Empty: no detection.
        masquerade_all: ``--masquerade-all``: mark all ClusterIP traffic for SNAT.
        masquerade_bit: ``--iptables-masquerade-bit``, 0..31 (default 14, mark ``0x4000``).
        masquerade_mark: the mark as written; None derives it from ``masquerade_bit`` as
            kube-proxy does (Go's ``%#08x``: ``0x00004000``). kube-proxy's unit tests use
            ``"0x4000"``.
        nodeport_addresses: ``--nodeport-addresses`` CIDRs, or ``("primary",)``; empty means
            every local address (kube-proxy's default in iptables mode).
        localhost_nodeports: ``--iptables-localhost-nodeports`` (IPv4 only; forced off when
            the NodePort addresses exclude 127.0.0.0/8).
        large_cluster_threshold: above this many endpoints in the family (kube-proxy's
            ``largeClusterEndpointsThreshold``, 1000) comments are left out of the endpoint
            dispatch and endpoint chains.
        random_fully: iptables supports ``MASQUERADE --random-fully`` (any iptables since 1.6.2).
        nfacct: the nfacct counters could be created, so kube-proxy adds its two metric-only
            ``-m nfacct`` rules. Off by default: the objects must exist before the restore.
        conntrack_tcp_be_liberal: ``net.netfilter.nf_conntrack_tcp_be_liberal`` is set, so no
            DROP of INVALID packets is installed.
    """

    family: IPFamily = IPFamily.IPv4
    node_ips: tuple[str, ...] = ()
    cluster_cidr: tuple[str, ...] = ()
    masquerade_all: bool = False
    masquerade_bit: int = DEFAULT_MASQUERADE_BIT
    masquerade_mark: str | None = None
    nodeport_addresses: tuple[str, ...] = ()
    localhost_nodeports: bool = DEFAULT_LOCALHOST_NODEPORTS
    large_cluster_threshold: int = 1000
    random_fully: bool = True
    nfacct: bool = False
    conntrack_tcp_be_liberal: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.family, IPFamily):
            raise ConfigError(f"family: expected IPFamily.IPv4 or IPFamily.IPv6, got {self.family!r}")
        if not 0 <= self.masquerade_bit <= 31:
            raise ConfigError(f"masquerade_bit: expected 0..31, got {self.masquerade_bit=}")
        if self.large_cluster_threshold < 0:
            raise ConfigError(f"large_cluster_threshold: expected >= 0, got {self.large_cluster_threshold=}")
        if self.masquerade_mark is not None:
            try:
                int(self.masquerade_mark, 16)
            except ValueError:
                raise ConfigError(
                    f"masquerade_mark: expected a hex mark such as 0x4000, got {self.masquerade_mark!r}"
                ) from None
        for ip in self.node_ips:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ConfigError(f"node_ips: expected IP addresses, got {ip!r}") from None
        for cidr in self.cluster_cidr:
            _network(cidr, "cluster_cidr")
        npa = self.nodeport_addresses
        if NODEPORT_ADDRESSES_PRIMARY in npa and len(npa) > 1:
            raise ConfigError(f"nodeport_addresses: 'primary' must be the only value, got {npa!r}")
        for cidr in npa:
            if cidr != NODEPORT_ADDRESSES_PRIMARY:
                _network(cidr, "nodeport_addresses")

    @classmethod
    def from_run(cls, run: RunConfig, family: IPFamily | None = None) -> IptablesConfig:
        """The iptables settings of a run configuration, rendering ``family`` (default: the primary).

        Every node IP is kept (the first of a family is its primary, as kube-proxy's ``nodeIP``);
        the run configuration has validated each value and named its flag or file field.

        Raises:
            ConfigError: never for a configuration :func:`~kproxy.config.build_run_config` built.
        """
        rules = run.rules
        return cls(family=family or run.primary_family, node_ips=run.node.node_ips,
                   cluster_cidr=rules.cluster_cidrs, masquerade_all=rules.masquerade_all,
                   masquerade_bit=rules.masquerade_bit, nodeport_addresses=rules.nodeport_addresses,
                   localhost_nodeports=rules.localhost_nodeports)

    @classmethod
    def kube_proxy_test_fake(cls, family: IPFamily = IPFamily.IPv4) -> IptablesConfig:
        """The settings of kube-proxy's ``NewFakeProxier`` (its unit tests' expected outputs).

        Node IPs 192.168.0.2, 192.168.1.2, 192.168.99.11, 2001:db8::1, 2001:db8:1::2; pods
        in 10.0.0.0/8 (fd00:10::/64); mark ``0x4000``; nfacct available; no ``--random-fully``.
        """
        return cls(
            family=family,
            node_ips=("192.168.0.2", "192.168.1.2", "192.168.99.11", "2001:db8::1", "2001:db8:1::2"),
            cluster_cidr=("10.0.0.0/8", "fd00:10::/64"),
            masquerade_mark="0x4000", random_fully=False, nfacct=True,
        )

    def for_family(self, family: IPFamily) -> IptablesConfig:
        """This configuration rendering ``family`` instead."""
        return self if family is self.family else replace(self, family=family)

    @property
    def mark(self) -> str:
        """The masquerade mark as written in the rules."""
        if self.masquerade_mark is not None:
            return self.masquerade_mark
        return "0x%08x" % (1 << self.masquerade_bit)


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyContext:
    """An :class:`IptablesConfig` resolved for one family; what the rule writers read.

    Attributes:
        config: the configuration.
        ipv6: rendering IPv6.
        mark: the masquerade mark text.
        if_local, if_not_local: the local detector's match text (``-s CIDR``, ``! -s CIDR``),
            ``""`` when there is no detector.
        localhost_nodeports: effective localhost NodePorts (IPv4 and 127.0.0.0/8 allowed).
        localhost_nodeport_nfacct: write the nfacct-counted 127.0.0.0/8 NodePort rule.
        node_ip: the primary node IP of the family, or None.
        nodeport_destinations: the match text of each KUBE-SERVICES -> KUBE-NODEPORTS rule.
    """

    config: IptablesConfig
    ipv6: bool
    mark: str
    if_local: str
    if_not_local: str
    localhost_nodeports: bool
    localhost_nodeport_nfacct: bool
    node_ip: str | None
    nodeport_destinations: tuple[str, ...]

    @property
    def has_local_detector(self) -> bool:
        """Local traffic can be told apart (``--cluster-cidr`` of this family was given)."""
        return bool(self.if_local)


def _primary_nodeport_cidrs(config: IptablesConfig) -> tuple[str, ...]:
    out: list[str] = []
    for v6, suffix in ((False, "/32"), (True, "/128")):
        ip = next((i for i in config.node_ips if _is_v6(i) == v6), None)
        if ip is not None and not ipaddress.ip_address(ip).is_loopback:
            out.append(ip + suffix)
    return tuple(out)


def _nodeport_networks(config: IptablesConfig, ipv6: bool) -> tuple[_IPNetwork, ...] | None:
    """The family's NodePort CIDRs, or None when every local address matches."""
    raw = config.nodeport_addresses
    if raw == (NODEPORT_ADDRESSES_PRIMARY,):
        raw = _primary_nodeport_cidrs(config)
    nets = tuple(_network(c, "nodeport_addresses") for c in raw if _is_v6(c) == ipv6)
    if not nets or any(n.prefixlen == 0 for n in nets):
        return None
    return nets


def _contains_ipv4_loopback(nets: tuple[_IPNetwork, ...] | None) -> bool:
    if nets is None:
        return True  # 0.0.0.0/0
    loop = ipaddress.IPv4Address("127.0.0.0")
    return any(
        isinstance(n, ipaddress.IPv4Network) and (n.network_address.is_loopback or loop in n) for n in nets
    )


def _nodeport_destinations(
    config: IptablesConfig, ipv6: bool, nets: tuple[_IPNetwork, ...] | None, localhost: bool
) -> tuple[str, ...]:
    if nets is None:
        if ipv6:
            return ("-m addrtype --dst-type LOCAL ! -d ::1/128",)
        return ("-m addrtype --dst-type LOCAL" + ("" if localhost else " ! -d 127.0.0.0/8"),)
    local = {ipaddress.ip_address(ip) for ip in (*config.node_ips, "::1" if ipv6 else "127.0.0.1")}
    out = []
    for ip in sorted(a for a in local if a.version == (6 if ipv6 else 4)):
        if any(ip in n for n in nets) and not (ip.is_loopback and (ipv6 or not localhost)):
            out.append(f"-d {ip}")
    return tuple(out)


def family_context(config: IptablesConfig) -> FamilyContext:
    """Resolve ``config`` for its family (see the module docstring)."""
    ipv6 = config.family is IPFamily.IPv6
    cidr = next((c for c in config.cluster_cidr if _is_v6(c) == ipv6), None)
    cidr_text = str(_network(cidr, "cluster_cidr")) if cidr is not None else ""
    nets = _nodeport_networks(config, ipv6)
    localhost = config.localhost_nodeports and not ipv6 and _contains_ipv4_loopback(nets)
    return FamilyContext(
        config=config, ipv6=ipv6, mark=config.mark,
        if_local=f"-s {cidr_text}" if cidr_text else "",
        if_not_local=f"! -s {cidr_text}" if cidr_text else "",
        localhost_nodeports=localhost,
        localhost_nodeport_nfacct=localhost and config.nfacct,
        node_ip=next((ip for ip in config.node_ips if _is_v6(ip) == ipv6), None),
        nodeport_destinations=_nodeport_destinations(config, ipv6, nets, localhost),
    )
