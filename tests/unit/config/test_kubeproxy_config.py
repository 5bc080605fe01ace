"""KubeProxyConfiguration files: kube-proxy's defaults, a round trip, and errors naming the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kproxy.config import (
    API_VERSION,
    KIND,
    default_configuration,
    dump_configuration,
    load_configuration,
    parse_configuration,
)
from kproxy.errors import ConfigError

HEAD = f"apiVersion: {API_VERSION}\nkind: {KIND}\n"


def test_defaults_are_kube_proxys() -> None:
    """An empty configuration gets SetDefaults_KubeProxyConfiguration's values."""
    cfg = default_configuration()
    assert (cfg.healthz_bind_address, cfg.metrics_bind_address) == ("0.0.0.0:10256", "127.0.0.1:10249")
    assert (cfg.sync_period_s, cfg.min_sync_period_s, cfg.config_sync_period_s) == (30.0, 1.0, 900.0)
    assert cfg.get("iptables.masqueradeBit") == 14 and cfg.get("oomScoreAdj") == -999
    assert cfg.get("conntrack.maxPerCore") == 32768 and cfg.get("conntrack.min") == 131072
    assert cfg.get("clientConnection.qps") == 5.0 and cfg.get("clientConnection.burst") == 10


def test_ipv6_bind_address_moves_the_default_addresses() -> None:
    """With an IPv6 bindAddress, healthz and metrics default to [::]:10256 and [::1]:10249."""
    cfg = parse_configuration({"apiVersion": API_VERSION, "kind": KIND, "bindAddress": "::"})
    assert (cfg.healthz_bind_address, cfg.metrics_bind_address) == ("[::]:10256", "[::1]:10249")


def test_missing_port_is_appended() -> None:
    """A healthz address without a port gets 10256, as AppendPortIfNeeded."""
    cfg = parse_configuration({"apiVersion": API_VERSION, "kind": KIND, "healthzBindAddress": "127.0.0.1"})
    assert cfg.healthz_bind_address == "127.0.0.1:10256"


def test_zero_min_sync_period_is_defaulted_as_in_kube_proxy() -> None:
    """iptables.minSyncPeriod: 0s in a file becomes 1s (SetDefaults treats zero as unset)."""
    cfg = parse_configuration({"apiVersion": API_VERSION, "kind": KIND, "iptables": {"minSyncPeriod": "0s"}})
    assert cfg.min_sync_period_s == 1.0


def test_mode_selects_its_sync_periods() -> None:
    """With mode nftables the nftables sync periods apply."""
    cfg = parse_configuration(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "mode": "nftables",
            "nftables": {"syncPeriod": "10s", "minSyncPeriod": "2s"},
        }
    )
    assert (cfg.sync_period_s, cfg.min_sync_period_s) == (10.0, 2.0)


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    """A dumped configuration reads back equal, and a written file loads with its values."""
    path = tmp_path / "config.yaml"
    path.write_text(
        HEAD + "hostnameOverride: node-a\nmode: userspace\nclusterCIDR: 10.244.0.0/16\n"
        "iptables:\n  syncPeriod: 1m\n  minSyncPeriod: 250ms\nnodePortAddresses: [127.0.0.0/8]\n"
    )
    cfg = load_configuration(path)
    assert (cfg.hostname_override, cfg.mode, cfg.cluster_cidr) == ("node-a", "userspace", "10.244.0.0/16")
    assert (cfg.sync_period_s, cfg.min_sync_period_s) == (60.0, 0.25)
    again = tmp_path / "again.yaml"
    again.write_text(dump_configuration(cfg))
    assert load_configuration(again).document == cfg.document


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("iptables:\n  syncPeriodd: 1s\n", "iptables.syncPeriodd"),
        ("surprise: 1\n", "surprise"),
        ("iptables:\n  masqueradeBit: 40\n", "iptables.masqueradeBit"),
        ("iptables:\n  syncPeriod: soon\n", "iptables.syncPeriod"),
        ("iptables:\n  syncPeriod: 1s\n  minSyncPeriod: 2s\n", "iptables.minSyncPeriod"),
        ("mode: turbo\n", "mode"),
        ("oomScoreAdj: 5000\n", "oomScoreAdj"),
        ("bindAddress: my-host\n", "bindAddress"),
        ("metricsBindAddress: nowhere:10249\n", "metricsBindAddress"),
        ("featureGates:\n  Foo: maybe\n", "featureGates"),
        ("conntrack:\n  min: -1\n", "conntrack.min"),
        ("nodePortAddresses: [everywhere]\n", "nodePortAddresses"),
    ],
)
def test_invalid_fields_are_errors_naming_them(tmp_path: Path, body: str, field: str) -> None:
    """Unknown or invalid fields raise ConfigError naming the file and the field's path."""
    path = tmp_path / "bad.yaml"
    path.write_text(HEAD + body)
    with pytest.raises(ConfigError, match=re.escape(f"bad.yaml: {field}:")):
        load_configuration(path)


def test_wrong_kind_and_version_are_refused() -> None:
    """Another kind or apiVersion is an error naming it."""
    with pytest.raises(ConfigError, match="kind"):
        parse_configuration({"apiVersion": API_VERSION, "kind": "KubeletConfiguration"})
    with pytest.raises(ConfigError, match="apiVersion"):
        parse_configuration({"apiVersion": "kubeproxy.config.k8s.io/v1beta1", "kind": KIND})


def test_duplicate_fields_and_bad_yaml_are_refused(tmp_path: Path) -> None:
    """Strict decoding: a duplicated field or broken YAML is an error naming the file."""
    path = tmp_path / "dup.yaml"
    path.write_text(HEAD + "mode: iptables\nmode: ipvs\n")
    with pytest.raises(ConfigError, match="duplicate field 'mode'"):
        load_configuration(path)
    path.write_text(HEAD + "iptables: [\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml: not valid YAML"):
        load_configuration(path)
