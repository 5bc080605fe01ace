# ruff: noqa: E501  (long command lines are kept whole to stay readable)
"""``kproxy render --proxy-mode ipvs`` and ``kproxy trace --proxy-mode ipvs`` / ``--ipvs-dump``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kproxy.cli.main import main
from kproxy.cli.render import IPVS_SECTION_PREFIX
from tests.scenarios import NODE, NODE_IP, cluster
from tests.unit.cli.trace_shares import address_shares

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


def test_render_prints_three_sections(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The render has the ipvsadm-save, ipset save and iptables-restore sections, in that order."""
    assert main(["render", "--manifests", str(manifests), "--proxy-mode", "ipvs", *FLAGS]) == 0
    out = capsys.readouterr().out
    titles = [line.removeprefix(IPVS_SECTION_PREFIX) for line in out.splitlines() if line.startswith(IPVS_SECTION_PREFIX)]
    assert titles == ["ipvsadm-save -n", "ipset save", "iptables-restore"]
    assert "-A -t 172.30.0.41:80 -s rr" in out
    assert "add KUBE-CLUSTER-IP 172.30.0.41,tcp:80" in out
    assert "-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN" in out


def test_render_takes_the_scheduler_flag(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--ipvs-scheduler sets every virtual server's scheduler."""
    assert main(["render", "--manifests", str(manifests), "--proxy-mode", "ipvs", "--ipvs-scheduler", "wlc", *FLAGS]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("-A -")]
    assert lines and all(" -s wlc" in line for line in lines)


def test_unknown_scheduler_is_a_usage_error(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown scheduler exits 2 naming the flag."""
    assert main(["render", "--manifests", str(manifests), "--proxy-mode", "ipvs", "--ipvs-scheduler", "nope"]) == 2
    assert "--ipvs-scheduler" in capsys.readouterr().err


def test_trace_json_adds_the_virtual_and_real_server(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The iptables JSON contract plus virtual_server, real_server and notes."""
    out = _trace(capsys, "--manifests", str(manifests), "--proxy-mode", "ipvs", *FLAGS, "--src", "10.0.0.2", "--dst", "172.30.0.41:80")
    assert set(out) == {"verdict", "endpoints", "masquerade", "trace", "virtual_server", "real_server", "notes", "node_ips", "node_ip_placeholder",
                        "snat", "delivery"}
    assert out["verdict"] == "ACCEPT" and out["masquerade"] is False
    assert out["virtual_server"] == "TCP 172.30.0.41:80" and out["real_server"] == "10.180.0.1:8080"
    assert address_shares(out["endpoints"]) == [{"address": "10.180.0.1:8080", "probability": 1.0}]
    assert any(step["table"] == "ipvs" for step in out["trace"])


def test_trace_connections_report_shares(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--connections 10 to a two-endpoint NodePort under rr splits 0.5 / 0.5."""
    out = _trace(capsys, "--manifests", str(manifests), "--proxy-mode", "ipvs", *FLAGS, "--src", "203.0.113.2",
                 "--dst", f"{NODE_IP}:30003", "--connections", "10")
    assert address_shares(out["endpoints"]) == [{"address": "10.180.0.2:8080", "probability": 0.5},
                                {"address": "10.180.1.1:8080", "probability": 0.5}]
    assert out["masquerade"] is True and any("10 simulated" in n for n in out["notes"])


def test_trace_no_endpoints_rejects(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A virtual server without real servers answers ICMP port unreachable: REJECT."""
    out = _trace(capsys, "--manifests", str(manifests), "--proxy-mode", "ipvs", *FLAGS, "--src", "10.0.0.2", "--dst", "172.30.0.46:80")
    assert out["verdict"] == "REJECT" and address_shares(out["endpoints"]) == [] and out["real_server"] is None


def test_trace_ipvs_save_dump_loads_as_ipvsadm_restore(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An ipvsadm-save dump is replayed in order, so rr first picks the last listed server."""
    dump = tmp_path / "ipvs.save"
    dump.write_text("-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.0.1.1:80 -m -w 1\n"
                    "-a -t 10.96.0.10:80 -r 10.0.1.2:80 -m -w 1\n")
    out = _trace(capsys, "--ipvs-dump", str(dump), "--node-ip", NODE_IP, "--src", "203.0.113.2", "--dst", "10.96.0.10:80")
    assert out["real_server"] == "10.0.1.2:80"
    assert any("ipvsadm-restore" in n for n in out["notes"])


def test_trace_nosort_listing_keeps_kernel_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An ipvsadm -Ln --nosort listing is kernel order: rr first picks the first listed server."""
    dump = tmp_path / "ipvs.list"
    dump.write_text("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n"
                    "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n"
                    "TCP  10.96.0.10:80 rr\n  -> 10.0.1.1:80                  Masq    1      0          0\n"
                    "  -> 10.0.1.2:80                  Masq    0      0          0\n")
    out = _trace(capsys, "--ipvs-dump", str(dump), "--node-ip", NODE_IP, "--src", "203.0.113.2", "--dst", "10.96.0.10:80")
    assert out["real_server"] == "10.0.1.1:80"
    assert any("weight 0 in the dump" in n for n in out["notes"])


def test_trace_dump_with_ipsets_and_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--ipset-save and --iptables-save feed the sets and rules: a marked ClusterIP packet is masqueraded."""
    (tmp_path / "ipvs").write_text("-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.0.1.1:80 -m -w 1\n")
    (tmp_path / "sets").write_text("create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n"
                                   "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80\n")
    (tmp_path / "rules").write_text(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n"
        ":KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n"
        "-A PREROUTING -j KUBE-SERVICES\n-A POSTROUTING -j KUBE-POSTROUTING\n"
        "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ\n"
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n"
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n-A KUBE-POSTROUTING -j MASQUERADE\nCOMMIT\n")
    out = _trace(capsys, "--ipvs-dump", str(tmp_path / "ipvs"), "--ipset-save", str(tmp_path / "sets"),
                 "--iptables-save", str(tmp_path / "rules"), "--node-ip", NODE_IP,
                 "--src", "203.0.113.2", "--dst", "10.96.0.10:80")
    assert out["verdict"] == "ACCEPT" and out["masquerade"] is True and out["real_server"] == "10.0.1.1:80"


def test_ipset_save_needs_an_ipvs_dump(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--ipset-save without --ipvs-dump is a usage error."""
    assert main(["trace", "--manifests", str(manifests), "--ipset-save", "x", "--src", "1.2.3.4", "--dst", "1.2.3.5:80"]) == 2
    assert "--ipvs-dump" in capsys.readouterr().err


def test_text_output_names_the_servers(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The human report names the virtual and the real server."""
    assert main(["trace", "--manifests", str(manifests), "--proxy-mode", "ipvs", *FLAGS, "--src", "10.0.0.2", "--dst", "172.30.0.41:80"]) == 0
    out = capsys.readouterr().out
    assert "virtual server: TCP 172.30.0.41:80" in out and "real server: 10.180.0.1:8080" in out
