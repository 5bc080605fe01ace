# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""``kproxy run --config``: the file's fields take effect, flags override them, none is dropped silently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kproxy.cli.main import main
from kproxy.config import Command, RunConfig, build_run_config
from kproxy.config.kubeproxy import API_VERSION, KIND
from kproxy.daemon.kernel import KernelRunOptions
from kproxy.errors import ConfigError

HEAD = f"apiVersion: {API_VERSION}\nkind: {KIND}\n"
RUN_MODES = ("userspace", "iptables", "ipvs")


def _run(tmp_path: Path, body: str, **flags: Any) -> RunConfig:
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(HEAD + body)
    given = {"--manifests": ["examples/cluster.yaml"], "--config": str(path), **flags}
    return build_run_config(given, command=Command.RUN, modes=RUN_MODES)


def test_file_mode_sets_the_proxy_mode(tmp_path: Path) -> None:
    """`mode: iptables` in the file selects iptables mode when --proxy-mode is not given."""
    assert _run(tmp_path, "mode: iptables\n").proxy_mode == "iptables"


def test_proxy_mode_flag_overrides_the_file(tmp_path: Path) -> None:
    """--proxy-mode given on the command line wins over the file's mode."""
    assert _run(tmp_path, "mode: iptables\n", **{"--proxy-mode": "userspace"}).proxy_mode == "userspace"


def test_file_iptables_fields_reach_the_iptables_config(tmp_path: Path) -> None:
    """masqueradeBit (even 0), masqueradeAll, localhostNodePorts, clusterCIDR and nodePortAddresses apply."""
    run = _run(tmp_path, "mode: iptables\niptables:\n  masqueradeBit: 0\n  masqueradeAll: true\n"
                         "  localhostNodePorts: false\nclusterCIDR: 10.244.0.0/16\n"
                         "nodePortAddresses: [192.168.0.0/24]\n")
    config = KernelRunOptions.from_run(run).iptables
    assert (config.masquerade_bit, config.masquerade_all, config.localhost_nodeports) == (0, True, False)
    assert config.cluster_cidr == ("10.244.0.0/16",)
    assert config.nodeport_addresses == ("192.168.0.0/24",)


def test_flags_override_the_files_iptables_fields(tmp_path: Path) -> None:
    """--iptables-masquerade-bit and --iptables-localhost-nodeports beat the file's values."""
    run = _run(tmp_path, "iptables:\n  masqueradeBit: 3\n  localhostNodePorts: false\n",
               **{"--proxy-mode": "iptables", "--iptables-masquerade-bit": 5, "--iptables-localhost-nodeports": True})
    config = KernelRunOptions.from_run(run).iptables
    assert (config.masquerade_bit, config.localhost_nodeports) == (5, True)


def test_unhonoured_field_is_named(tmp_path: Path) -> None:
    """A known field kproxy cannot honour (conntrack.maxPerCore) is listed by name, to be warned about."""
    assert _run(tmp_path, "conntrack:\n  maxPerCore: 1\n").unhonoured_fields == ("conntrack.maxPerCore",)


def test_iptables_field_in_userspace_mode_is_named(tmp_path: Path) -> None:
    """iptables.masqueradeAll set in the file while running userspace mode is listed as unhonoured."""
    assert "iptables.masqueradeAll" in _run(tmp_path, "iptables:\n  masqueradeAll: true\n").unhonoured_fields


def test_file_mode_kproxy_does_not_run_is_an_error_naming_the_field(tmp_path: Path) -> None:
    """`mode: nftables` without --proxy-mode is a ConfigError naming the file and `mode`."""
    with pytest.raises(ConfigError, match=r"kube-proxy\.yaml: mode: .*'nftables'"):
        _run(tmp_path, "mode: nftables\n")


def test_file_mode_ipvs_runs_the_ipvs_mode(tmp_path: Path) -> None:
    """`mode: ipvs` in the file settles --proxy-mode ipvs, and its ipvs.scheduler is taken."""
    run = _run(tmp_path, "mode: ipvs\nipvs:\n  scheduler: lc\n")
    assert (run.proxy_mode, run.rules.ipvs_scheduler) == ("ipvs", "lc")


def test_bad_duration_names_the_field_once(tmp_path: Path) -> None:
    """A bad iptables.syncPeriod is an error naming the field once, not twice in a row."""
    with pytest.raises(ConfigError) as err:
        _run(tmp_path, "iptables:\n  syncPeriod: soon\n")
    assert str(err.value).count("iptables.syncPeriod") == 1


def test_bad_file_healthz_address_names_the_field_not_the_flag(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A healthzBindAddress from the file with a bad port is an exit-2 error naming healthzBindAddress."""
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(HEAD + "healthzBindAddress: 127.0.0.1:99999\nmetricsBindAddress: 127.0.0.1:0\n")
    assert main(["run", "--manifests", "examples/cluster.yaml", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "healthzBindAddress" in err and "--healthz-bind-address" not in err
