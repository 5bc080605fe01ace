"""``kproxy run --config``: the file's fields take effect, flags override them, none is dropped silently."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from kproxy.cli.main import _kernel_options, build_parser, main
from kproxy.config.flags import merge_config
from kproxy.config.kubeproxy import API_VERSION, KIND
from kproxy.daemon import UserspaceOptions
from kproxy.errors import ConfigError

HEAD = f"apiVersion: {API_VERSION}\nkind: {KIND}\n"


def _args(tmp_path: Path, body: str, *flags: str) -> object:
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(HEAD + body)
    args = build_parser().parse_args(["run", "--manifests", "examples/cluster.yaml", "--config", str(path),
                                      *flags])
    merge_config(args)
    return args


def test_file_mode_sets_the_proxy_mode(tmp_path: Path) -> None:
    """`mode: iptables` in the file selects iptables mode when --proxy-mode is not given."""
    args = _args(tmp_path, "mode: iptables\n")
    assert args.proxy_mode == "iptables"  # type: ignore[attr-defined]


def test_proxy_mode_flag_overrides_the_file(tmp_path: Path) -> None:
    """--proxy-mode given on the command line wins over the file's mode."""
    args = _args(tmp_path, "mode: iptables\n", "--proxy-mode", "userspace")
    assert args.proxy_mode == "userspace"  # type: ignore[attr-defined]


def test_file_iptables_fields_reach_the_iptables_config(tmp_path: Path) -> None:
    """masqueradeBit (even 0), masqueradeAll, localhostNodePorts, clusterCIDR and nodePortAddresses apply."""
    args = _args(tmp_path, "mode: iptables\niptables:\n  masqueradeBit: 0\n  masqueradeAll: true\n"
                           "  localhostNodePorts: false\nclusterCIDR: 10.244.0.0/16\n"
                           "nodePortAddresses: [192.168.0.0/24]\n")
    config = _kernel_options(args, UserspaceOptions()).iptables  # type: ignore[arg-type]
    assert (config.masquerade_bit, config.masquerade_all, config.localhost_nodeports) == (0, True, False)
    assert config.cluster_cidr == ("10.244.0.0/16",)
    assert config.nodeport_addresses == ("192.168.0.0/24",)


def test_flags_override_the_files_iptables_fields(tmp_path: Path) -> None:
    """--iptables-masquerade-bit and --iptables-localhost-nodeports beat the file's values."""
    args = _args(tmp_path, "iptables:\n  masqueradeBit: 3\n  localhostNodePorts: false\n", "--proxy-mode",
                 "iptables", "--iptables-masquerade-bit", "5", "--iptables-localhost-nodeports", "true")
    config = _kernel_options(args, UserspaceOptions()).iptables  # type: ignore[arg-type]
    assert (config.masquerade_bit, config.localhost_nodeports) == (5, True)


def test_unhonoured_field_is_warned_about_by_name(tmp_path: Path) -> None:
    """A known field kproxy cannot honour (conntrack.maxPerCore) is logged with its name."""
    with capture_logs() as logs:
        _args(tmp_path, "conntrack:\n  maxPerCore: 1\n")
    assert [e["field"] for e in logs if e.get("log_level") == "warning"] == ["conntrack.maxPerCore"]


def test_iptables_field_in_userspace_mode_is_warned_about(tmp_path: Path) -> None:
    """iptables.masqueradeAll set in the file while running userspace mode is a warning naming it."""
    with capture_logs() as logs:
        _args(tmp_path, "iptables:\n  masqueradeAll: true\n")
    assert "iptables.masqueradeAll" in [e.get("field") for e in logs]


def test_file_mode_kproxy_does_not_run_is_an_error_naming_the_field(tmp_path: Path) -> None:
    """`mode: nftables` without --proxy-mode is a ConfigError naming the file and `mode`."""
    with pytest.raises(ConfigError, match=r"kube-proxy\.yaml: mode: .*'nftables'"):
        _args(tmp_path, "mode: nftables\n")


def test_file_mode_ipvs_runs_the_ipvs_mode(tmp_path: Path) -> None:
    """`mode: ipvs` in the file settles --proxy-mode ipvs, and its ipvs.scheduler is taken."""
    args = _args(tmp_path, "mode: ipvs\nipvs:\n  scheduler: lc\n")
    assert (args.proxy_mode, args.ipvs_scheduler) == ("ipvs", "lc")  # type: ignore[attr-defined]


def test_bad_duration_names_the_field_once(tmp_path: Path) -> None:
    """A bad iptables.syncPeriod is an error naming the field once, not twice in a row."""
    with pytest.raises(ConfigError) as err:
        _args(tmp_path, "iptables:\n  syncPeriod: soon\n")
    assert str(err.value).count("iptables.syncPeriod") == 1


def test_bad_file_healthz_address_names_the_field_not_the_flag(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A healthzBindAddress from the file with a bad port is an exit-2 error naming healthzBindAddress."""
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(HEAD + "healthzBindAddress: 127.0.0.1:99999\nmetricsBindAddress: 127.0.0.1:0\n")
    assert main(["run", "--manifests", "examples/cluster.yaml", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "healthzBindAddress" in err and "--healthz-bind-address" not in err
