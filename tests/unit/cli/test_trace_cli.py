# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""``kproxy trace``: verdict, endpoints, masquerade and the path, as JSON and as text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kproxy.cli.main import main
from tests.scenarios import NODE, NODE_IP, cluster
from tests.unit.cli.trace_shares import address_shares

DUMP = Path(__file__).resolve().parents[2] / "emulation" / "data" / "node-dump.iptables-save"
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


def test_json_has_exactly_the_documented_keys(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A NodePort from outside: two endpoints at 0.5, masqueraded, a trace of rule records."""
    out = _trace(capsys, "--manifests", str(manifests), *FLAGS, "--src", "203.0.113.2", "--dst",
                 f"{NODE_IP}:30003")
    assert set(out) == {"verdict", "endpoints", "masquerade", "trace", "node_ips", "node_ip_placeholder",
                        "snat", "delivery", "notes"}
    assert out["verdict"] == "ACCEPT" and out["masquerade"] is True
    assert address_shares(out["endpoints"]) == [{"address": "10.180.0.2:8080", "probability": 0.5},
                                {"address": "10.180.1.1:8080", "probability": 0.5}]
    assert all(set(step) == {"table", "chain", "rule", "line", "unknown"} for step in out["trace"])
    assert not any(step["unknown"] for step in out["trace"])
    assert out["trace"][0] == {"table": "nat", "chain": "PREROUTING", "line": 0, "unknown": False,
                               "rule": '-A PREROUTING -m comment --comment "kubernetes service portals" '
                                       "-j KUBE-SERVICES"}
    assert any(step["chain"] == "KUBE-NODEPORTS" and step["line"] > 0 for step in out["trace"])


def test_no_endpoints_is_rejected_without_endpoints(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ClusterIP without endpoints: REJECT, nothing translated, the REJECT rule in the trace."""
    out = _trace(capsys, "--manifests", str(manifests), *FLAGS, "--src", "10.0.0.2:5555", "--dst", "172.30.0.46:80")
    assert (out["verdict"], out["endpoints"], out["masquerade"]) == ("REJECT", [], False)
    assert any("has no endpoints" in step["rule"] for step in out["trace"])


def test_node_ip_source_goes_through_output(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A source equal to --node-ip is generated on the node: nat OUTPUT is walked, not PREROUTING."""
    out = _trace(capsys, "--manifests", str(manifests), *FLAGS, "--src", NODE_IP, "--dst", "172.30.0.41:81",
                 "--proto", "udp")
    chains = [step["chain"] for step in out["trace"]]
    assert "OUTPUT" in chains and "PREROUTING" not in chains
    assert address_shares(out["endpoints"]) == [{"address": "10.180.0.1:8080", "probability": 1.0}] and out["masquerade"]


def test_text_output_is_readable(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The text report names the verdict, each endpoint and the matched rules with their lines."""
    assert main(["trace", "--manifests", str(manifests), *FLAGS, "--src", "203.0.113.130",
                 "--dst", "5.6.7.8:80"]) == 0
    text = capsys.readouterr().out
    assert "verdict: DROP" in text
    assert "endpoints: none" in text
    assert "KUBE-PROXY-FIREWALL" in text and "line " in text


def test_iptables_save_dump_of_a_real_node(capsys: pytest.CaptureFixture[str]) -> None:
    """A dump with kubelet, Docker and CNI rules: the NodePort reaches both endpoints, masqueraded."""
    out = _trace(capsys, "--iptables-save", str(DUMP), "--node-ip", "192.168.0.2", "--src", "203.0.113.9:999",
                 "--dst", "192.168.0.2:30080")
    assert out["verdict"] == "ACCEPT" and out["masquerade"] is True
    assert {e["address"] for e in out["endpoints"]} == {"10.244.1.5:8080", "10.244.2.7:8080"}
    assert sum(e["probability"] for e in out["endpoints"]) == pytest.approx(1.0)
    lines = DUMP.read_text().splitlines()
    for step in out["trace"]:
        if step["line"]:
            assert step["chain"] in lines[step["line"] - 1]


def test_exactly_one_rule_source_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    """Neither --manifests nor --iptables-save is a usage error (exit 2)."""
    assert main(["trace", "--src", "1.2.3.4", "--dst", "5.6.7.8:80"]) == 2
    assert "exactly one" in capsys.readouterr().err


def test_bad_destination_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A destination without a port exits 2 naming --dst."""
    assert main(["trace", "--iptables-save", str(DUMP), "--src", "1.2.3.4", "--dst", "5.6.7.8"]) == 2
    assert "--dst" in capsys.readouterr().err


@pytest.mark.parametrize("rules", [["-A INPUT -j FOO", "-A FOO -j FOO"], ["-A A -j B", "-A B -g A"]])
def test_chain_loop_in_a_dump_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], rules: list[str]) -> None:
    """iptables-restore refuses a loop ("Too many links"); trace names the file, chain and line."""
    dump = tmp_path / "loop.txt"
    dump.write_text("*filter\n:INPUT ACCEPT [0:0]\n:FOO - [0:0]\n:A - [0:0]\n:B - [0:0]\n" + "\n".join(rules) + "\nCOMMIT\n")
    assert main(["trace", "--iptables-save", str(dump), "--src", "1.1.1.1", "--dst", "192.0.2.1:80"]) == 2
    err = capsys.readouterr().err
    assert str(dump) in err and "chain loop" in err and "line 7" in err and "Traceback" not in err
    assert ("FOO -> FOO" in err) or ("A -> B -> A" in err)


def test_unknown_steps_are_marked_in_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unmodelled match and an unmodelled target are ``"unknown": true``; others false."""
    dump = tmp_path / "dump.txt"
    dump.write_text("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m bpf --bytecode \"1,6 0 0 0\" -j ACCEPT\n"
                    "-A INPUT -p tcp -j NFQUEUE --queue-num 3\n-A INPUT -p tcp -j ACCEPT\nCOMMIT\n")
    out = _trace(capsys, "--iptables-save", str(dump), "--src", "1.1.1.1", "--dst", "192.0.2.1:80")
    assert set(out) == {"verdict", "endpoints", "masquerade", "trace", "node_ips", "node_ip_placeholder",
                        "snat", "delivery", "notes"}
    assert all(set(step) == {"table", "chain", "rule", "line", "unknown"} for step in out["trace"])
    flags = {step["line"]: step["unknown"] for step in out["trace"]}
    assert flags.get(3) is True
    assert flags.get(4) is True
