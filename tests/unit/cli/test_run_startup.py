"""`kproxy run` start-up: client flag errors, health check addresses and mode-specific flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from kproxy.cli.main import main
from kproxy.config import Command, build_run_config
from kproxy.daemon.setup import observability_options


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--kubeconfig", "{tmp}/broken.yaml"], "broken.yaml"),
        (["--kubeconfig", "{tmp}/missing.yaml"], "missing.yaml"),
        (["--master", "not a url"], "--master"),
    ],
)
def test_bad_client_flag_is_a_clean_exit_2(flags: list[str], named: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A broken or missing kubeconfig, or a --master that is no URL, exits 2 naming it, with no traceback."""
    (tmp_path / "broken.yaml").write_text("clusters: [\n")
    argv = ["run", "--healthz-bind-address", "", "--metrics-bind-address", "",
            *[f.format(tmp=tmp_path) for f in flags]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_healthcheck_bind_addresses_flag_sets_the_health_check_node_port_addresses() -> None:
    """--healthcheck-bind-addresses 127.0.0.2,::1 is where health check node ports will listen."""
    run = build_run_config({"--manifests": ["examples/cluster.yaml"],
                            "--healthcheck-bind-addresses": "127.0.0.2,::1"}, command=Command.RUN)
    assert observability_options(run).health_check_addresses == ("127.0.0.2", "::1")


def test_bad_healthcheck_bind_address_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """A --healthcheck-bind-addresses entry that is not an IP is exit 2 naming the flag."""
    assert main(["run", "--manifests", "examples/cluster.yaml", "--healthcheck-bind-addresses", "eth0"]) == 2
    assert "--healthcheck-bind-addresses" in capsys.readouterr().err


def test_help_says_run_runs_every_registered_mode(capsys: pytest.CaptureFixture[str]) -> None:
    """`kproxy --help` describes run with every mode of the registry, not userspace only."""
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "(userspace, iptables, nftables, ipvs mode)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("flags", "ignored"),
    [
        (["--kernel", "linux"], "--kernel"),
        (["--proxy-mode", "iptables", "--address-map", "map.json"], "--address-map"),
        (["--proxy-mode", "iptables", "--bind-address", "127.0.0.1"], "--bind-address"),
        (["--proxy-mode", "iptables", "--udp-timeout", "5s"], "--udp-timeout"),
    ],
)
def test_flag_the_mode_does_not_use_is_warned_about(flags: list[str], ignored: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A flag the chosen mode ignores is logged as a warning naming it (the run stops at a bad path)."""
    assert main(["run", "--manifests", "/nonexistent/kproxy.yaml", "--log-format", "json", *flags]) == 2
    captured = capsys.readouterr()
    logged = captured.out + captured.err
    assert "flag ignored" in logged and f'"flag": "{ignored}"' in logged
