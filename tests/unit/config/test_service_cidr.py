# ruff: noqa: E501  (nft rule text and flag values are kept whole)
"""``--service-cidr CIDR[,CIDR]``: parsed into canonical CIDRs of both families, reaching the nftables renderer."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.config import Command, RunConfig, build_run_config
from kproxy.config.values import parse_service_cidrs
from kproxy.errors import ConfigError
from kproxy.model import IPFamily
from kproxy.modes.nftables import NftablesConfig, render_transaction
from tests.unit.modes.kube import endpoint_slice, ep, port, service, snapshot_of


def _build(given: dict[str, Any], command: Command = Command.RENDER) -> RunConfig:
    modes = ("userspace", "iptables", "ipvs", "nftables")
    return build_run_config(given, command=command, modes=modes, environ={}, gethostname=lambda: "node-a")


def test_service_cidrs_are_canonical_and_keep_both_families() -> None:
    """Host bits are cleared, spaces and duplicates dropped, several CIDRs of one family kept."""
    assert parse_service_cidrs(" 10.96.0.1/12, fd00:10:96::/112,10.96.0.0/12,172.30.0.0/16",
                               name="--service-cidr") == ("10.96.0.0/12", "fd00:10:96::/112", "172.30.0.0/16")
    assert parse_service_cidrs("", name="--service-cidr") == ()


def test_a_bad_service_cidr_names_the_flag() -> None:
    """A value that is not a CIDR is a ConfigError naming --service-cidr and the value."""
    with pytest.raises(ConfigError, match=r"--service-cidr: .*'10\.96\.0\.0/40'"):
        _build({"--proxy-mode": "nftables", "--service-cidr": "10.96.0.0/40"})


def test_service_cidr_flag_reaches_the_run_configuration() -> None:
    """The flag's CIDRs land in RunConfig.rules.service_cidrs; without it there are none."""
    assert _build({"--proxy-mode": "nftables", "--service-cidr": "10.96.0.0/12,fd00::/108"}).rules.service_cidrs == (
        "10.96.0.0/12", "fd00::/108")
    assert _build({"--proxy-mode": "nftables"}).rules.service_cidrs == ()


def test_service_cidr_is_listed_as_unused_outside_the_nftables_mode() -> None:
    """kproxy run warns that --service-cidr does nothing in the iptables and userspace modes."""
    for mode in ("iptables", "userspace"):
        config = _build({"--proxy-mode": mode, "--service-cidr": "10.96.0.0/12"}, Command.RUN)
        assert "--service-cidr" in config.ignored_flags
    assert "--service-cidr" not in _build({"--proxy-mode": "nftables", "--service-cidr": "10.96.0.0/12"},
                                          Command.RUN).ignored_flags


def test_each_family_table_drops_only_its_own_service_cidrs() -> None:
    """The ip table drops in the IPv4 ranges (all of them, in one set), the ip6 table in the IPv6 one;
    the ClusterIP REJECT rule is there either way."""
    snap = snapshot_of([service("ns1", "svc1", "10.96.0.41", [port("p80", 80)]),
                        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], [("p80", 80, "TCP")])])
    config = NftablesConfig.from_run(node_ips=("192.168.0.2", "2001:db8::1"),
                                     service_cidr=("10.96.0.0/12", "172.30.0.0/16", "fd00:10:96::/112"))
    v4 = render_transaction(snap, config)
    assert ('add rule ip kube-proxy cluster-ips-check ip daddr { 10.96.0.0/12,172.30.0.0/16 } drop '
            'comment "Drop traffic to unallocated ClusterIPs"') in v4.splitlines()
    v6 = render_transaction(snap, config.for_family(IPFamily.IPv6))
    assert ('add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:10:96::/112 } drop '
            'comment "Drop traffic to unallocated ClusterIPs"') in v6.splitlines()
    for text in (v4, v6):
        assert "Reject traffic to invalid ports of ClusterIPs" in text
