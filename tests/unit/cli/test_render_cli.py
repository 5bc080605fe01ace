# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""``kproxy render``: the restore input for manifests, as the renderer writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kproxy.cli.main import main
from kproxy.modes.iptables import render_full
from tests.scenarios import CONFIGS, NODE, NODE_IP, cluster
from tests.unit.modes.kube import snapshot_of


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster()}))
    return path


def test_render_prints_the_full_restore_input(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The output is render_full of the manifests' snapshot with the flags' settings."""
    code = main(["render", "--manifests", str(manifests), "--proxy-mode", "iptables", "--hostname-override", NODE,
                 "--node-ip", NODE_IP, "--cluster-cidr", "10.0.0.0/8"])
    assert code == 0
    assert capsys.readouterr().out == render_full(snapshot_of(cluster(), hostname=NODE), CONFIGS["detect"])


def test_render_masquerade_all_and_nodeport_addresses(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--masquerade-all adds an unconditional masquerade rule; --nodeport-addresses names addresses."""
    main(["render", "--manifests", str(manifests), "--hostname-override", NODE, "--node-ip", NODE_IP,
          "--masquerade-all", "--nodeport-addresses", "192.168.0.0/24"])
    out = capsys.readouterr().out
    assert '-d 172.30.0.41 --dport 80 -j KUBE-MARK-MASQ' in out
    assert "-d 192.168.0.2 -j KUBE-NODEPORTS" in out
    assert "--dst-type LOCAL -j KUBE-NODEPORTS" not in out


def test_render_bad_cidr_is_a_usage_error(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed --cluster-cidr exits 2 naming the flag."""
    assert main(["render", "--manifests", str(manifests), "--cluster-cidr", "10.0.0.0/99"]) == 2
    assert "--cluster-cidr" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "flag"), [
    (["--cluster-cidr", "10.0.0.0/8,10.1.0.0/16"], "--cluster-cidr"),
    (["--cluster-cidr", "nope"], "--cluster-cidr"),
    (["--iptables-masquerade-bit", "32"], "--iptables-masquerade-bit"),
    (["--nodeport-addresses", "nope"], "--nodeport-addresses"),
])
def test_bad_flags_name_the_flag(manifests: Path, capsys: pytest.CaptureFixture[str], flags: list[str], flag: str) -> None:
    """kube-proxy allows one --cluster-cidr per family; errors name flags, never config fields."""
    assert main(["render", "--manifests", str(manifests), *flags]) == 2
    err = capsys.readouterr().err
    assert flag in err and "masquerade_bit" not in err and "cluster_cidr" not in err and "nodeport_addresses" not in err


def test_dual_stack_cluster_cidr_is_accepted(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--manifests", str(manifests), "--cluster-cidr", "10.0.0.0/8,fd00::/64"]) == 0


def test_missing_manifests_path_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["render", "--manifests", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
