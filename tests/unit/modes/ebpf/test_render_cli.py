# ruff: noqa: E501  (long command lines are kept whole to stay readable)
"""``kproxy render --proxy-mode ebpf``: the cilium-dbg-like table and the JSON document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kproxy.cli.main import main
from tests.unit.modes.kube import endpoint_slice, ep, port, service

_DOCS = [
    service("ns", "web", "10.96.0.10", [port("http", 80, nodePort=30080)], type="NodePort",
            sessionAffinity="ClientIP"),
    endpoint_slice("ns", "web", [ep("10.244.1.5", "node-a"), ep("10.244.2.5", "node-b")], [("http", 8080, "TCP")]),
]


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": _DOCS}))
    return path


def test_render_ebpf_json_is_the_documented_document(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["render", "-f", str(manifests), "--proxy-mode", "ebpf", "--node-ip", "192.168.1.10",
                 "--bpf-lb-algorithm", "maglev", "--bpf-lb-maglev-table-size", "251", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"schema", "services", "backends", "reverse_nat", "affinity_match", "maglev"}
    by_frontend = {s["frontend"]: s for s in doc["services"]}
    assert set(by_frontend) == {"10.96.0.10:80/TCP", "0.0.0.0:30080/TCP", "192.168.1.10:30080/TCP"}
    cluster = by_frontend["10.96.0.10:80/TCP"]
    assert cluster["scope"] == "external" and cluster["rev_nat_index"] == 1
    assert cluster["count"] == 2 and cluster["qcount"] == 0 and cluster["affinity_timeout"] == 10800
    assert cluster["flags"] == ["ClusterIP", "sessionAffinity", "non-routable"]
    assert cluster["algorithm"] == "maglev" and cluster["slots"] == [1, 2]
    assert doc["backends"] == [{"id": 1, "address": "10.244.1.5:8080/TCP", "state": "active"},
                               {"id": 2, "address": "10.244.2.5:8080/TCP", "state": "active"}]
    assert {"rev_nat_index": 1, "address": "10.96.0.10:80"} in doc["reverse_nat"]
    assert {"rev_nat_index": 1, "backend_id": 2} in doc["affinity_match"]
    node = by_frontend["192.168.1.10:30080/TCP"]
    [table] = [m["table"] for m in doc["maglev"]]
    assert [m["rev_nat_index"] for m in doc["maglev"]] == [node["rev_nat_index"]]
    assert len(table) == 251 and set(table) == {1, 2}


def test_render_ebpf_prints_a_table_like_cilium_dbg(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(manifests), "--proxy-mode", "ebpf", "--node-ip", "192.168.1.10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["SERVICE", "ADDRESS", "BACKEND", "ADDRESS", "(REVNAT_ID)", "(SLOT)"]
    assert ["10.96.0.10:80/TCP", "(1)", "10.244.1.5:8080/TCP", "(1)", "(1)"] in [line.split() for line in lines]
    master = [line for line in lines if line.startswith("192.168.1.10:30080/TCP (0)")]
    assert master and master[0].endswith("0.0.0.0:0 (3) (0) [NodePort, sessionAffinity]")


def test_render_ebpf_refuses_a_table_size_cilium_refuses(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["render", "-f", str(manifests), "--proxy-mode", "ebpf", "--bpf-lb-maglev-table-size", "1000"])
    assert code != 0
    assert "--bpf-lb-maglev-table-size" in capsys.readouterr().err
