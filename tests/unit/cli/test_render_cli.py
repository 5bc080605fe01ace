# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""``kproxy render``: the restore input for manifests, as the renderer writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kproxy.cli.main import main
from kproxy.modes.iptables import render_full
from tests.unit.kernel.scenarios import CONFIGS, NODE, NODE_IP, cluster
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
    assert "cluster_cidr" in capsys.readouterr().err
