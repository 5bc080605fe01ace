"""The command line rejects bad flags with exit status 2 and a message naming the flag."""

from __future__ import annotations

import pytest

from kproxy.cli.main import main


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--min-sync-period", "5s", "--sync-period", "1s"], "--sync-period"),
        (["--min-sync-period", "soon"], "--min-sync-period"),
        (["--bind-address", "not-an-ip"], "--bind-address"),
        (["--loopback-block", "127.0.0.0/33"], "--loopback-block"),
        (["--ip-families", "IPv5"], "--ip-families"),
        (["--udp-timeout", "0s"], "--udp-timeout"),
        (["--sync-period", "30"], "--sync-period"),
        (["--drain-timeout", "nan"], "--drain-timeout"),
        (["--address-map", "/nonexistent-kproxy-dir/map.json"], "--address-map"),
    ],
)
def test_bad_flag_exits_2_naming_it(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    """Each bad flag value gives exit status 2 and names the flag on stderr."""
    status = main(["run", "--manifests", "examples/cluster.yaml", *argv])
    assert status == 2
    assert named in capsys.readouterr().err


def test_proxy_mode_offers_only_the_modes_run_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """`run --proxy-mode ebpf` (no such mode yet) is refused by the parser (exit 2), listing run's modes."""
    with pytest.raises(SystemExit) as exc:
        main(["run", "--manifests", "examples/cluster.yaml", "--proxy-mode", "ebpf"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--proxy-mode" in err and "'userspace', 'iptables', 'nftables', 'ipvs')" in err


def test_missing_manifest_path_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A manifest path that does not exist stops kproxy at once, naming the path."""
    status = main(["run", "--manifests", "/nonexistent/kproxy-manifests.yaml"])
    assert status != 0
    assert "/nonexistent/kproxy-manifests.yaml" in capsys.readouterr().err


def test_run_accepts_the_iptables_node_flags() -> None:
    """`run` takes the iptables mode's node flags, as `render` and `trace` do."""
    from kproxy.cli.main import build_parser

    args = build_parser().parse_args([
        "run", "--manifests", "examples/cluster.yaml", "--proxy-mode", "iptables",
        "--node-ip", "192.168.0.10", "--cluster-cidr", "10.244.0.0/16", "--masquerade-all",
        "--nodeport-addresses", "192.168.0.0/24"])
    assert args.node_ip == ["192.168.0.10"]
    assert args.cluster_cidr == "10.244.0.0/16"
    assert args.masquerade_all is True
    assert args.nodeport_addresses == "192.168.0.0/24"


def test_a_full_loopback_block_names_the_flags_not_fields() -> None:
    """A ClusterIP left without a loopback address asks for a larger --loopback-block or a --bind-address."""
    from kproxy.errors import ConfigError
    from kproxy.modes.userspace.addresses import plan_listen

    with pytest.raises(ConfigError) as err:
        plan_listen(cluster_ip="10.96.0.9", port=80, bind_address=None, loopback={})
    assert "--loopback-block" in str(err.value) and "--bind-address" in str(err.value)
    assert "loopback_block" not in str(err.value) and "bind_address" not in str(err.value)
