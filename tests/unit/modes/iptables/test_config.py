"""IptablesConfig validation and its per-family resolution."""

from __future__ import annotations

import pytest

from kproxy.errors import ConfigError
from kproxy.model import IPFamily
from kproxy.modes.iptables import JUMP_RULES, KUBELET_JUMP_RULES, IptablesConfig, nfacct_counters
from kproxy.modes.iptables.config import family_context

NODE = ("192.168.0.2", "192.168.1.2", "2001:db8::1")


@pytest.mark.parametrize("kwargs", [
    {"masquerade_bit": 32}, {"masquerade_bit": -1}, {"cluster_cidr": ("10.0.0.0/33",)},
    {"nodeport_addresses": ("nonsense",)}, {"nodeport_addresses": ("primary", "10.0.0.0/8")},
    {"node_ips": ("1.2.3",)}, {"masquerade_mark": "4000x"}, {"large_cluster_threshold": -1},
])
def test_rejects_bad_settings(kwargs: dict[str, object]) -> None:
    """Impossible settings raise ConfigError naming the field."""
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        IptablesConfig(**kwargs)  # type: ignore[arg-type]


def test_mark_follows_go_formatting() -> None:
    """kube-proxy formats 1<<bit with Go's %#08x: eight digits after 0x."""
    assert IptablesConfig().mark == "0x00004000"
    assert IptablesConfig(masquerade_bit=0).mark == "0x00000001"
    assert IptablesConfig(masquerade_mark="0x4000").mark == "0x4000"


def test_default_nodeports_match_every_local_address() -> None:
    """No --nodeport-addresses: one tail call matching LOCAL destinations."""
    ctx = family_context(IptablesConfig(node_ips=NODE))
    assert ctx.nodeport_destinations == ("-m addrtype --dst-type LOCAL",)
    assert ctx.localhost_nodeports


def test_localhost_nodeports_disabled_excludes_loopback() -> None:
    """--iptables-localhost-nodeports=false keeps 127.0.0.0/8 out of the LOCAL match."""
    ctx = family_context(IptablesConfig(node_ips=NODE, localhost_nodeports=False))
    assert ctx.nodeport_destinations == ("-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8",)


def test_ipv6_never_has_localhost_nodeports() -> None:
    """IPv6 excludes ::1 and never writes KUBE-FIREWALL's rule."""
    ctx = family_context(IptablesConfig(node_ips=NODE, family=IPFamily.IPv6))
    assert ctx.nodeport_destinations == ("-m addrtype --dst-type LOCAL ! -d ::1/128",)
    assert not ctx.localhost_nodeports


def test_explicit_nodeport_addresses_pick_local_ips() -> None:
    """CIDRs select the node's addresses inside them; loopback only with localhost NodePorts."""
    npa = ("192.168.0.0/24", "127.0.0.1/32", "2001:db8::/64")
    cfg = IptablesConfig(node_ips=NODE, nodeport_addresses=npa)
    assert family_context(cfg).nodeport_destinations == ("-d 127.0.0.1", "-d 192.168.0.2")
    off = IptablesConfig(node_ips=NODE, nodeport_addresses=("192.168.0.0/16",))
    ctx = family_context(off)
    assert ctx.nodeport_destinations == ("-d 192.168.0.2", "-d 192.168.1.2")
    assert not ctx.localhost_nodeports  # forced off: 127.0.0.0/8 is not a NodePort address
    v6 = family_context(cfg.for_family(IPFamily.IPv6))
    assert v6.nodeport_destinations == ("-d 2001:db8::1",)


def test_primary_nodeport_addresses() -> None:
    """'primary' means the first node IP of each family."""
    cfg = IptablesConfig(node_ips=NODE, nodeport_addresses=("primary",))
    assert family_context(cfg).nodeport_destinations == ("-d 192.168.0.2",)


def test_local_detector_uses_cluster_cidr_of_the_family() -> None:
    """The first --cluster-cidr of the family drives -s / ! -s; none disables detection."""
    cfg = IptablesConfig(cluster_cidr=("fd00:10::/64", "10.0.0.0/8"))
    assert family_context(cfg).if_not_local == "! -s 10.0.0.0/8"
    assert family_context(cfg.for_family(IPFamily.IPv6)).if_local == "-s fd00:10::/64"
    assert not family_context(IptablesConfig()).has_local_detector


def test_jump_rules_are_kube_proxys() -> None:
    """The jump rules carry kube-proxy's matches and comments."""
    assert len(JUMP_RULES) == 12
    nat_pre = [j for j in JUMP_RULES if j.table == "nat" and j.chain == "PREROUTING"]
    assert [j.restore_line() for j in nat_pre] == [
        '-I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES']
    assert JUMP_RULES[0].argv == (
        "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment",
        "kubernetes externally-visible service portals", "-j", "KUBE-EXTERNAL-SERVICES")
    assert KUBELET_JUMP_RULES[0].restore_line() == "-I INPUT -j KUBE-FIREWALL"


def test_nfacct_counters() -> None:
    """The nfacct objects needed before a restore."""
    assert nfacct_counters(IptablesConfig()) == ()
    assert nfacct_counters(IptablesConfig(nfacct=True)) == (
        "ct_state_invalid_dropped_pkts", "localhost_nps_accepted_pkts")
    assert nfacct_counters(IptablesConfig(nfacct=True, family=IPFamily.IPv6)) == (
        "ct_state_invalid_dropped_pkts",)
