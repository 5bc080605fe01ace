# ruff: noqa: E501  (long calls are kept whole to stay readable)
"""Cilium's load-balancing flags of the ebpf mode, validated as Cilium's agent validates them,
and the node addresses NodePort frontends are expanded over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kproxy.cli.main import main
from kproxy.config import Command, RunConfig, build_run_config
from kproxy.errors import ConfigError
from kproxy.model import IPFamily
from kproxy.modes.ebpf import EbpfConfig, LBAlgorithm

RENDER_MODES = ("iptables", "nftables", "ipvs", "ebpf")


def _build(given: dict[str, Any]) -> RunConfig:
    return build_run_config(given, command=Command.RENDER, modes=RENDER_MODES, default_mode="iptables",
                            environ={}, gethostname=lambda: "node-a")


def test_cilium_defaults_without_flags() -> None:
    cfg = EbpfConfig.from_run(_build({"--proxy-mode": "ebpf"}))
    assert cfg.algorithm == "random" and cfg.default_algorithm is LBAlgorithm.RANDOM
    assert cfg.maglev.table_size == 16381 and cfg.maglev.hash_seed == "JLfvgnHc2kaSUFaI"


def test_the_flags_reach_the_mode() -> None:
    run = _build({"--proxy-mode": "ebpf", "--bpf-lb-algorithm": "maglev", "--bpf-lb-maglev-table-size": "1021",
                  "--bpf-lb-maglev-hash-seed": "AAAAAAAAAAAAAAAA", "--node-ip": ["192.168.1.10", "fd00::10"]})
    cfg = EbpfConfig.from_run(run)
    assert cfg.default_algorithm is LBAlgorithm.MAGLEV
    assert cfg.maglev.table_size == 1021 and cfg.maglev.seed_murmur == 0
    assert cfg.nodeport_ips(IPFamily.IPv4) == ("192.168.1.10",)
    assert cfg.nodeport_ips(IPFamily.IPv6) == ("fd00::10",)
    assert run.ignored_flags == ()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--bpf-lb-algorithm", "roundrobin", "--bpf-lb-algorithm: expected one of random, maglev"),
    ("--bpf-lb-maglev-table-size", "1000", "supported values are"),
    ("--bpf-lb-maglev-hash-seed", "AAAA", "not 12 bytes"),
    ("--bpf-lb-maglev-hash-seed", "***", "cannot decode base64"),
])
def test_values_cilium_refuses_are_config_errors_naming_the_flag(flag: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=flag) as err:
        _build({"--proxy-mode": "ebpf", flag: value})
    assert message in str(err.value)


def test_cilium_flags_are_ignored_flags_of_run_in_the_other_modes() -> None:
    for mode in ("userspace", "iptables", "ipvs"):
        run = build_run_config({"--proxy-mode": mode, "--bpf-lb-algorithm": "maglev"}, command=Command.RUN,
                               modes=("userspace", "iptables", "ipvs"), environ={}, gethostname=lambda: "node-a")
        assert run.ignored_flags == ("--bpf-lb-algorithm",), mode


def test_render_warns_that_cilium_flags_are_ignored_in_another_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.json"
    path.write_text('{"apiVersion": "v1", "kind": "List", "items": []}')
    assert main(["render", "-f", str(path), "--proxy-mode", "iptables", "--bpf-lb-algorithm", "maglev"]) == 0
    assert "--bpf-lb-algorithm" in capsys.readouterr().err


def test_nodeport_addresses_narrow_the_expansion_and_skip_loopback() -> None:
    cfg = EbpfConfig(node_ips=("127.0.0.1", "192.168.1.10", "10.0.0.5", "fe80::1", "fd00::10"),
                     nodeport_addresses=("10.0.0.0/8",))
    assert cfg.nodeport_ips(IPFamily.IPv4) == ("10.0.0.5",)
    assert cfg.nodeport_ips(IPFamily.IPv6) == ("fd00::10",)  # no IPv6 CIDR given: every address
    assert EbpfConfig(node_ips=("192.168.1.10", "10.0.0.5"), nodeport_addresses=("primary",)).nodeport_ips(IPFamily.IPv4) == ("192.168.1.10",)
    with pytest.raises(ConfigError):
        EbpfConfig(node_ips=("not-an-ip",))
