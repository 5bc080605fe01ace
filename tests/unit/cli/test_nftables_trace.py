# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""``kproxy trace --proxy-mode nftables`` and ``--nft-ruleset FILE``: the iptables contract, plus lookups.

The node ruleset (``tests/emulation/data/node-ruleset.nft``) is what nft 1.0.6 listed from a
kernel holding kube-proxy's table for the scenario cluster beside a firewalld-like ``inet``
filter table on the same hooks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kproxy.cli.main import main
from tests.scenarios import NODE, NODE_IP, cluster
from tests.unit.cli.trace_shares import address_shares

RULESET = Path(__file__).resolve().parents[2] / "emulation" / "data" / "node-ruleset.nft"
FLAGS = ["--hostname-override", NODE, "--node-ip", NODE_IP, "--cluster-cidr", "10.0.0.0/8"]


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster()}))
    return path


def _trace(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    assert main(["trace", *args, "--json"]) == 0
    out: dict = json.loads(capsys.readouterr().out)  # type: ignore[type-arg]
    return out


def _node(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    return _trace(capsys, "--nft-ruleset", str(RULESET), "--node-ip", NODE_IP, *args)


def test_node_ruleset_nodeport_is_balanced_with_numgen_branch_probabilities(capsys: pytest.CaptureFixture[str]) -> None:
    """A UDP NodePort from outside: the service-nodeports map hits, numgen branches 2 ways at 0.5, masqueraded."""
    out = _node(capsys, "--src", "203.0.113.2", "--dst", f"{NODE_IP}:30003", "--proto", "udp")
    assert out["verdict"] == "ACCEPT" and out["masquerade"] is True
    assert address_shares(out["endpoints"]) == [{"address": "10.180.0.2:8080", "probability": 0.5},
                                {"address": "10.180.1.1:8080", "probability": 0.5}]
    lookups = [(s["rule"], s["result"]) for s in out["trace"] if s["result"].startswith("lookup")]
    assert ("meta l4proto . th dport vmap @service-nodeports", "lookup:hit") in lookups
    assert ("ip daddr @nodeport-ips", "lookup:hit") in lookups
    branches = [s for s in out["trace"] if s["result"] == "numgen"]
    assert sorted(s["rule"] for s in branches) == ["numgen random mod 2 = 0", "numgen random mod 2 = 1"]
    assert all(s["probability"] == 0.5 and s["target"].startswith("goto endpoint-") for s in branches)
    assert all(s["line"] > 0 for s in out["trace"] if s["result"] != "policy")
    assert set(out["trace"][0]) == {"table", "chain", "rule", "line", "unknown", "hook", "result", "target", "probability"}


def test_node_ruleset_other_components_table_runs_after_kube_proxy_by_priority(capsys: pytest.CaptureFixture[str]) -> None:
    """A port that is no Service's: kube-proxy's filter-input (priority filter) lets it by, then firewalld's
    filter_INPUT (filter + 10) rejects it with its last rule; both tables are in the trace, in that order."""
    out = _node(capsys, "--src", "203.0.113.2", "--dst", f"{NODE_IP}:8080")
    assert out["verdict"] == "REJECT" and out["endpoints"] == []
    inputs = [(s["table"], s["chain"]) for s in out["trace"] if s["hook"] == "INPUT"]
    assert inputs.index(("ip kube-proxy", "filter-input")) < inputs.index(("inet firewalld", "filter_INPUT"))
    assert out["trace"][-1]["rule"] == "reject with icmpx admin-prohibited"
    assert ("inet firewalld", "filter_IN_public_allow") not in {(s["table"], s["chain"]) for s in out["trace"]
                                                                 if s["result"] == "match"}


def test_node_ruleset_allowed_port_is_accepted_by_the_firewall(capsys: pytest.CaptureFixture[str]) -> None:
    """SSH from outside: firewalld's filter_IN_public_allow accepts tcp dport 22; nothing is translated."""
    out = _node(capsys, "--src", "203.0.113.2", "--dst", f"{NODE_IP}:22")
    assert out["verdict"] == "ACCEPT" and out["endpoints"] == [] and out["masquerade"] is False
    assert {"table": "inet firewalld", "chain": "filter_IN_public_allow", "rule": "tcp dport 22 accept"}.items() <= next(
        s for s in out["trace"] if s["chain"] == "filter_IN_public_allow").items()


def test_node_ruleset_unknown_statement_is_an_explicit_unknown_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A statement the emulator does not model (osf) is read leniently: an unknown step, an uncertain outcome, a note."""
    text = RULESET.read_text().replace("\t\tct status dnat accept\n", "\t\tosf name \"Linux\" drop\n\t\tct status dnat accept\n", 1)
    path = tmp_path / "ruleset.nft"
    path.write_text(text)
    out = _trace(capsys, "--nft-ruleset", str(path), "--node-ip", NODE_IP, "--src", "203.0.113.2", "--dst", f"{NODE_IP}:22")
    unknown = [s for s in out["trace"] if s["unknown"]]
    assert unknown and unknown[0]["result"] == "unknown" and "osf" in unknown[0]["rule"]
    assert any("not modelled" in note for note in out["notes"])


def test_manifests_trace_in_nftables_mode_has_no_localhost_nodeports(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--proxy-mode nftables renders the table: a NodePort on 127.0.0.1 is not translated (KEP-3866), where iptables DNATs it."""
    args = ["--manifests", str(manifests), *FLAGS, "--src", "127.0.0.1", "--dst", "127.0.0.1:30003"]
    nft = _trace(capsys, *args, "--proxy-mode", "nftables")
    ipt = _trace(capsys, *args, "--proxy-mode", "iptables")
    assert ipt["endpoints"] and not nft["endpoints"]
    assert all(s["table"] == "ip kube-proxy" for s in nft["trace"])


def test_manifests_trace_in_nftables_mode_balances_a_clusterip(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ClusterIP from a pod: the service-ips map sends it to the service chain, two endpoints at 0.5, as iptables."""
    args = ["--manifests", str(manifests), *FLAGS, "--src", "10.0.0.2", "--dst", "172.30.0.43:80"]
    nft = _trace(capsys, *args, "--proxy-mode", "nftables")
    ipt = _trace(capsys, *args, "--proxy-mode", "iptables")
    assert address_shares(nft["endpoints"]) == address_shares(ipt["endpoints"]) and len(nft["endpoints"]) == 2
    assert any(s["rule"].endswith("vmap @service-ips") and s["result"] == "lookup:hit" for s in nft["trace"])


def test_nft_ruleset_with_manifests_is_refused(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--nft-ruleset is a whole node's ruleset: with --manifests it is exit 2 naming both."""
    assert main(["trace", "--nft-ruleset", str(RULESET), "--manifests", str(manifests), "--src", "10.0.0.2", "--dst", "172.30.0.43:80"]) == 2
    err = capsys.readouterr().err
    assert "--nft-ruleset" in err and "--manifests" in err


def test_nft_ruleset_with_another_proxy_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--nft-ruleset implies the nftables mode: --proxy-mode iptables with it is exit 2."""
    assert main(["trace", "--nft-ruleset", str(RULESET), "--proxy-mode", "iptables", "--src", "10.0.0.2", "--dst", "172.30.0.43:80"]) == 2
    assert "implies --proxy-mode nftables" in capsys.readouterr().err


def test_text_report_shows_lookups_and_branch_probabilities(capsys: pytest.CaptureFixture[str]) -> None:
    """The text form names each lookup's hit or miss and each step's probability."""
    assert main(["trace", "--nft-ruleset", str(RULESET), "--node-ip", NODE_IP, "--src", "203.0.113.2", "--dst", f"{NODE_IP}:30003", "--proto", "udp"]) == 0
    out = capsys.readouterr().out
    assert "hit: meta l4proto . th dport vmap @service-nodeports" in out
    assert "p=0.5000 numgen random mod 2 = 1 -> goto endpoint-" in out
