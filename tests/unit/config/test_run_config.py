# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""The run configuration: its defaults, flags over the file over the environment, and errors naming their origin."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kproxy.config import Command, Kernel, RunConfig, build_run_config
from kproxy.config.defaults import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_HEALTHZ_BIND_ADDRESS,
    DEFAULT_LOOPBACK_BLOCK,
    DEFAULT_METRICS_BIND_ADDRESS,
    DEFAULT_UDP_TIMEOUT_S,
)
from kproxy.daemon import UserspaceOptions
from kproxy.daemon.kernel import KernelRunOptions
from kproxy.errors import ConfigError, InvalidArgument
from kproxy.model import IPFamily
from kproxy.modes.iptables import IptablesConfig
from kproxy.modes.ipvs import IpvsConfig

HEAD = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
RUN_MODES = ("userspace", "iptables", "ipvs")


def _build(given: dict[str, Any] | None = None, *, command: Command = Command.RUN,
           environ: dict[str, str] | None = None, host: str = "Host-1") -> RunConfig:
    return build_run_config(given or {}, command=command, modes=RUN_MODES if command is Command.RUN else (),
                            environ=environ or {}, gethostname=lambda: host)


def _file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(HEAD + body)
    return str(path)


def test_defaults_are_kube_proxys_and_kproxys_own() -> None:
    """With no flag, no file and no NODE_NAME, every setting has its documented default."""
    run = _build()
    assert run.proxy_mode == "userspace" and run.rules.kernel is Kernel.EMULATED
    assert (run.sync.min_sync_period_s, run.sync.sync_period_s) == (1.0, 30.0)
    assert (run.rules.masquerade_bit, run.rules.localhost_nodeports, run.rules.ipvs_scheduler) == (14, True, "rr")
    assert run.userspace.loopback_block == DEFAULT_LOOPBACK_BLOCK == "127.0.0.0/8"
    assert (run.userspace.udp_timeout_s, run.userspace.drain_timeout_s) == (DEFAULT_UDP_TIMEOUT_S,
                                                                          DEFAULT_DRAIN_TIMEOUT_S)
    assert run.observability.healthz_bind_address == DEFAULT_HEALTHZ_BIND_ADDRESS == "127.0.0.1:10256"
    assert run.observability.metrics_bind_address == DEFAULT_METRICS_BIND_ADDRESS == "127.0.0.1:10249"
    assert run.node.ip_families == (IPFamily.IPv4, IPFamily.IPv6)
    assert (run.node.hostname, run.node.hostname_from) == ("host-1", "the host name")


def test_the_daemons_options_default_to_the_run_configurations_defaults() -> None:
    """UserspaceOptions() and UserspaceOptions.from_run(defaults) are equal: one set of defaults."""
    assert UserspaceOptions.from_run(_build()) == UserspaceOptions()


def test_the_configuration_is_frozen() -> None:
    """A run configuration cannot be changed after it is built."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        _build().sync.sync_period_s = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(("given", "file_body", "environ", "expected", "origin"), [
    ({"--hostname-override": "Flag-Node"}, "hostnameOverride: file-node\n", {"NODE_NAME": "env"}, "flag-node",
     "--hostname-override"),
    ({}, "hostnameOverride: file-node\n", {"NODE_NAME": "env"}, "file-node", "hostnameOverride"),
    ({}, "", {"NODE_NAME": " Env-Node "}, "env-node", "NODE_NAME"),
    ({}, "", {}, "host-1", "the host name"),
])
def test_node_name_is_the_flag_then_the_file_then_node_name_then_the_host_name(
        tmp_path: Path, given: dict[str, Any], file_body: str, environ: dict[str, str], expected: str,
        origin: str) -> None:
    """kube-proxy's --hostname-override, else the file's hostnameOverride, else NODE_NAME, else the host name."""
    run = _build({**given, "--config": _file(tmp_path, file_body)}, environ=environ)
    assert run.node.hostname == expected and run.node.hostname_from.endswith(origin)


def test_an_empty_node_name_is_an_error_naming_the_flag() -> None:
    """No flag, no file field, no NODE_NAME and an empty host name: an error asking for --hostname-override."""
    with pytest.raises(ConfigError, match="--hostname-override"):
        _build(host="  ")


@pytest.mark.parametrize(("flags", "field"), [
    ({"--proxy-mode": "iptables"}, ("proxy_mode", "iptables")),
    ({"--min-sync-period": "2s"}, ("min_sync_period_s", 2.0)),
    ({"--sync-period": "1m"}, ("sync_period_s", 60.0)),
    ({"--iptables-masquerade-bit": 3}, ("masquerade_bit", 3)),
    ({"--cluster-cidr": "10.1.0.0/16"}, ("cluster_cidrs", ("10.1.0.0/16",))),
    ({"--nodeport-addresses": "192.168.9.0/24"}, ("nodeport_addresses", ("192.168.9.0/24",))),
    ({"--ipvs-scheduler": "sh"}, ("ipvs_scheduler", "sh")),
    ({"--iptables-localhost-nodeports": "true"}, ("localhost_nodeports", True)),
    ({"--healthz-bind-address": "127.0.0.5:1"}, ("healthz_bind_address", "127.0.0.5:1")),
])
def test_a_flag_given_wins_over_the_file(tmp_path: Path, flags: dict[str, Any], field: tuple[str, Any]) -> None:
    """Each flag given on the command line overrides the file's field for it, as kube-proxy's flags do."""
    body = ("mode: ipvs\niptables: {minSyncPeriod: 5s, syncPeriod: 10m, masqueradeBit: 9, localhostNodePorts: false}\n"
            "ipvs: {scheduler: lc, minSyncPeriod: 5s, syncPeriod: 10m}\nclusterCIDR: 10.9.0.0/16\n"
            "nodePortAddresses: [10.8.0.0/16]\nhealthzBindAddress: 127.0.0.9:9\n")
    from_file = _build({"--config": _file(tmp_path, body)})
    from_flag = _build({"--config": _file(tmp_path, body), **flags})
    name, value = field
    sections = (from_flag.rules, from_flag.sync, from_flag.observability)
    got = next(getattr(s, name) for s in sections if hasattr(s, name))
    before = next(getattr(s, name) for s in (from_file.rules, from_file.sync, from_file.observability)
                  if hasattr(s, name))
    assert got == value and before != value


def test_the_files_fields_apply_when_no_flag_is_given(tmp_path: Path) -> None:
    """mode, the ipvs sync periods, scheduler, clusterCIDR and nodePortAddresses come from the file."""
    run = _build({"--config": _file(tmp_path, "mode: ipvs\nipvs: {scheduler: lc, minSyncPeriod: 5s, syncPeriod: 10m}\n"
                                              "clusterCIDR: 10.9.0.0/16,fd00:9::/64\n"
                                              "nodePortAddresses: [10.8.0.0/16]\n")})
    assert (run.proxy_mode, run.rules.ipvs_scheduler) == ("ipvs", "lc")
    assert (run.sync.min_sync_period_s, run.sync.sync_period_s) == (5.0, 600.0)
    assert run.rules.cluster_cidrs == ("10.9.0.0/16", "fd00:9::/64")
    assert run.rules.nodeport_addresses == ("10.8.0.0/16",)


@pytest.mark.parametrize(("given", "named"), [
    ({"--min-sync-period": "-1s"}, "--min-sync-period"),
    ({"--sync-period": "30"}, "--sync-period"),
    ({"--min-sync-period": "5s", "--sync-period": "1s"}, "--sync-period (1s) must be > 0 and >= --min-sync-period"),
    ({"--udp-timeout": "0s"}, "--udp-timeout"),
    ({"--max-connections": "0"}, "--max-connections: expected a whole number >= 1"),
    ({"--max-udp-sessions-per-service": "ten"}, "--max-udp-sessions-per-service"),
    ({"--drain-timeout": "nan"}, "--drain-timeout"),
    ({"--bind-address": "0.0.0.0"}, "--bind-address"),
    ({"--bind-address": "eth0"}, "--bind-address"),
    ({"--loopback-block": "::1/128"}, "--loopback-block"),
    ({"--loopback-block": "127.0.0.0/33"}, "--loopback-block"),
    ({"--node-ip": ["192.168.0.300"]}, "--node-ip"),
    ({"--cluster-cidr": "10.0.0.0/8,10.1.0.0/16"}, "--cluster-cidr"),
    ({"--cluster-cidr": "nope"}, "--cluster-cidr"),
    ({"--iptables-masquerade-bit": 32}, "--iptables-masquerade-bit"),
    ({"--nodeport-addresses": "192.168.0.2"}, "--nodeport-addresses"),
    ({"--ipvs-scheduler": "fastest"}, "--ipvs-scheduler"),
    ({"--ip-families": "IPv5"}, "--ip-families"),
    ({"--ip-families": "IPv4,IPv4"}, "--ip-families"),
    ({"--ip-families": "IPv4", "--ip-family": "IPv4"}, "--ip-family and --ip-families"),
    ({"--healthcheck-bind-addresses": "eth0"}, "--healthcheck-bind-addresses"),
    ({"--iptables-localhost-nodeports": "maybe"}, "--iptables-localhost-nodeports"),
    ({"--kernel": "bsd"}, "--kernel"),
    ({"--log-format": "xml"}, "--log-format"),
    ({"--proxy-mode": "nftables"}, "--proxy-mode"),
    ({"--manifests": ["a.yaml"], "--kubeconfig": "k"}, "--manifests cannot be combined with --kubeconfig"),
    ({"--manifests": ["-", "-"]}, "--manifests"),
])
def test_every_bad_flag_value_names_the_flag(given: dict[str, Any], named: str) -> None:
    """A bad value is a ConfigError naming kube-proxy's flag, never a Python field such as loopback_block."""
    with pytest.raises(ConfigError) as err:
        _build(given)
    assert named in str(err.value)
    assert not any(f in str(err.value) for f in ("loopback_block", "masquerade_bit", "cluster_cidr", "node_ips",
                                                 "nodeport_addresses", "udp_timeout", "bind_address"))


@pytest.mark.parametrize(("body", "named"), [
    ("mode: nftables\n", "mode"),
    ("iptables: {minSyncPeriod: 10m, syncPeriod: 1m}\n", "iptables.minSyncPeriod"),
    ("iptables: {masqueradeBit: 40}\n", "iptables.masqueradeBit"),
    ("clusterCIDR: 10.0.0.0/8,10.1.0.0/16\n", "clusterCIDR"),
    ("ipvs: {scheduler: fastest}\n", "ipvs.scheduler"),
    ("nodePortAddresses: [192.168.0.2]\n", "nodePortAddresses"),
    ("bogus: 1\n", "bogus"),
])
def test_every_bad_file_value_names_the_file_and_the_field(tmp_path: Path, body: str, named: str) -> None:
    """A bad value in --config is a ConfigError naming the file and the field's path."""
    path = _file(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        _build({"--config": path})
    assert f"--config {path}: {named}" in str(err.value)


def test_a_flag_given_hides_a_bad_value_in_the_file_only_where_it_wins(tmp_path: Path) -> None:
    """--ipvs-scheduler given wins over the file's ipvs.scheduler, so the file's value is not used."""
    assert _build({"--config": _file(tmp_path, "ipvs: {scheduler: lc}\n"),
                   "--ipvs-scheduler": "sh"}).rules.ipvs_scheduler == "sh"


def test_the_files_kubeconfig_yields_to_manifests_given(tmp_path: Path) -> None:
    """clientConnection.kubeconfig is not used when --manifests is given (the flag wins), and a note says so."""
    path = _file(tmp_path, "clientConnection: {kubeconfig: /var/lib/kube-proxy/kubeconfig.conf}\n")
    with_manifests = _build({"--config": path, "--manifests": ["m.yaml"]})
    assert with_manifests.source.kubeconfig is None
    assert any("clientConnection.kubeconfig is not used" in n for n in with_manifests.notes)
    assert _build({"--config": path}).source.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"


def test_an_all_default_logging_block_is_not_unhonoured(tmp_path: Path) -> None:
    """kubeadm's logging block (flushFrequency 0, infoBufferSize "0", verbosity 0) is not reported; verbosity 4 is."""
    quiet = ("logging:\n  flushFrequency: 0\n  options:\n    json: {infoBufferSize: '0'}\n"
             "    text: {infoBufferSize: '0'}\n  verbosity: 0\n")
    assert _build({"--config": _file(tmp_path, quiet)}).unhonoured_fields == ()
    assert _build({"--config": _file(tmp_path, "logging: {verbosity: 4}\n")}).unhonoured_fields == (
        "logging.verbosity",)


def test_node_ips_may_repeat_a_family_and_set_the_families() -> None:
    """Several --node-ip per family are kept in order; the families are theirs, primary first."""
    run = _build({"--node-ip": ["2001:db8::1", "192.168.0.2", "192.168.1.2"]})
    assert run.node.node_ips == ("2001:db8::1", "192.168.0.2", "192.168.1.2")
    assert run.node.ip_families == (IPFamily.IPv6, IPFamily.IPv4)
    assert run.node.primary_ip(IPFamily.IPv4) == "192.168.0.2"
    assert run.node.primary_ips() == ("2001:db8::1", "192.168.0.2")


def test_ip_family_flag_means_one_family_everywhere() -> None:
    """--ip-family IPv6 and --ip-families IPv6 build the same node."""
    assert _build({"--ip-family": "IPv6"}).node.ip_families == _build({"--ip-families": "IPv6"}).node.ip_families


def test_the_mode_configs_are_built_from_the_run_configuration() -> None:
    """IptablesConfig.from_run and IpvsConfig.from_run carry every rule setting and every node IP."""
    run = _build({"--proxy-mode": "ipvs", "--node-ip": ["192.168.0.2", "192.168.1.2"], "--cluster-cidr": "10.0.0.0/8",
                  "--masquerade-all": True, "--iptables-masquerade-bit": 5, "--ipvs-scheduler": "wlc",
                  "--nodeport-addresses": "primary", "--iptables-localhost-nodeports": False})
    ipt = IptablesConfig.from_run(run)
    assert (ipt.family, ipt.node_ips, ipt.cluster_cidr) == (IPFamily.IPv4, ("192.168.0.2", "192.168.1.2"),
                                                            ("10.0.0.0/8",))
    assert (ipt.masquerade_all, ipt.masquerade_bit, ipt.nodeport_addresses, ipt.localhost_nodeports) == (
        True, 5, ("primary",), False)
    ipvs = IpvsConfig.from_run(run, IPFamily.IPv6)
    assert (ipvs.family, ipvs.scheduler, ipvs.masquerade_bit) == (IPFamily.IPv6, "wlc", 5)
    options = KernelRunOptions.from_run(run)
    assert options.mode == "ipvs" and options.ipvs is not None and options.ipvs.scheduler == "wlc"


def test_flags_the_mode_does_not_use_are_listed() -> None:
    """Userspace-only flags in the iptables mode, and kernel flags in userspace mode, are listed to warn about."""
    assert _build({"--proxy-mode": "iptables", "--udp-timeout": "5s", "--ipvs-scheduler": "sh"}).ignored_flags == (
        "--udp-timeout", "--ipvs-scheduler")
    assert _build({"--node-ip": ["192.168.0.2"], "--kernel": "linux"}).ignored_flags == ("--node-ip", "--kernel")


def test_an_unknown_flag_name_is_a_programming_error() -> None:
    """A flag the builder does not know is an InvalidArgument, not silently dropped."""
    with pytest.raises(InvalidArgument, match="--no-such-flag"):
        _build({"--no-such-flag": 1})


def test_address_map_must_be_a_file_in_an_existing_folder(tmp_path: Path) -> None:
    """--address-map naming a folder, or a file in a missing folder, is refused at start-up naming the flag."""
    with pytest.raises(ConfigError, match=r"--address-map: .* is a folder"):
        _build({"--address-map": str(tmp_path)})
    with pytest.raises(ConfigError, match="--address-map: folder"):
        _build({"--address-map": str(tmp_path / "missing" / "map.json")})


def test_connection_caps_reach_the_userspace_limits() -> None:
    """--max-connections and its three siblings set the caps; the ones not given are sized from RLIMIT_NOFILE."""
    run = _build({"--max-connections": "40", "--max-connections-per-service": "3", "--max-udp-sessions": "7"})
    limits = UserspaceOptions.from_run(run).limits()
    assert (limits.max_connections, limits.max_connections_per_service, limits.max_udp_sessions) == (40, 3, 7)
    sized = UserspaceOptions.from_run(_build()).limits()
    assert limits.max_udp_sessions_per_service == sized.max_udp_sessions_per_service >= 1
