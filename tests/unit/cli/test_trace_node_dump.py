# ruff: noqa: E501  (long test names are kept whole)
"""`kproxy trace --node-dump DIR` and the single `--ip-*` files, on `ip -j` output captured from a
flannel-like namespace (tests/emulation/data/nodedump/flannel: eth0 192.168.50.2/24, cni0
10.244.0.1/24 with port veth1, flannel.1 10.244.0.0/32, 10.244.1.0/24 via flannel.1)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kproxy.cli.main import main

DATA = Path(__file__).parents[2] / "emulation" / "data" / "nodedump" / "flannel"

#: Docker/flannel-shaped rules: FORWARD policy DROP, accept only cni0 -> not cni0 and replies;
#: masquerade pod traffic leaving the pod network; a DNAT for a ClusterIP to a remote pod.
RULES = """\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -d 10.96.0.11/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.244.1.7:8080
-A OUTPUT -d 10.96.0.11/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.244.1.7:8080
-A POSTROUTING -s 10.244.0.0/16 ! -o cni0 -j MASQUERADE
-A POSTROUTING -s 192.168.50.0/24 -o fl+ -j MASQUERADE
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -i cni0 ! -o cni0 -j ACCEPT
-A FORWARD -i eth0 -o flannel.1 -j ACCEPT
COMMIT
"""


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """A node dump directory: the captured files, these rules, ip_forward on, one recent list."""
    out = tmp_path / "dump"
    shutil.copytree(DATA, out)
    (out / "iptables-save.txt").write_text(RULES)
    (out / "sysctl.txt").write_text("net.ipv4.ip_forward = 1\nnet.ipv4.conf.all.route_localnet = 0\n")
    return out


def _trace(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    capsys.readouterr()
    assert main(["trace", *argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_a_pod_packet_arrives_on_cni0_and_is_masqueraded_to_eth0s_address(
        dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _trace(capsys, "--node-dump", str(dump), "--src", "10.244.0.5:5000", "--dst", "8.8.8.8:53",
                 "--proto", "udp")
    assert out["verdict"] == "ACCEPT"  # -i cni0 ! -o cni0 matched the real names (not eth0 -> eth0)
    assert out["snat"] == {"target": "MASQUERADE", "address": "192.168.50.2"}
    assert out["node_ips"] == ["192.168.50.2", "10.244.0.1", "10.244.0.0"]
    assert out["node_ip_placeholder"] is False
    notes = out["notes"]
    assert isinstance(notes, list) and any("1 entry" in n for n in notes)


def test_traffic_to_a_remote_pod_is_masqueraded_to_flannel_1s_address(
        dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _trace(capsys, "--node-dump", str(dump), "--src", "192.168.50.9:41000", "--dst", "10.96.0.11:80")
    assert out["verdict"] == "ACCEPT"
    assert out["snat"] == {"target": "MASQUERADE", "address": "10.244.0.0"}  # -o fl+ matched flannel.1
    (endpoint,) = out["endpoints"]  # type: ignore[misc]
    assert endpoint["address"] == "10.244.1.7:8080" and endpoint["source"].startswith("10.244.0.0:")
    assert any(step["chain"] == "PREROUTING" and "DNAT" in step["rule"] for step in endpoint["trace"])


def test_without_the_dump_the_one_interface_model_drops_what_the_node_forwards(
        dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _trace(capsys, "--iptables-save", str(dump / "iptables-save.txt"), "--node-ip", "192.168.50.2",
                 "--src", "10.244.0.5:5000", "--dst", "8.8.8.8:53", "--proto", "udp")
    assert out["verdict"] == "DROP"  # arrives on eth0, leaves by eth0: FORWARD policy DROP
    notes = out["notes"]
    assert isinstance(notes, list) and any("one interface eth0" in n for n in notes)


def test_single_files_beside_iptables_save_and_in_interface(
        dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = ["--iptables-save", str(dump / "iptables-save.txt"), "--ip-addr", str(dump / "ip-addr.json"),
             "--ip-route", str(dump / "ip-route.json"), "--ip-link", str(dump / "ip-link.json")]
    out = _trace(capsys, *files, "--src", "10.244.0.5:5000", "--dst", "10.96.0.11:80")
    # no sysctl.txt among the single files: ip_forward keeps the model's default (on)
    assert out["verdict"] == "ACCEPT" and out["snat"] == {"target": "MASQUERADE", "address": "10.244.0.0"}
    out = _trace(capsys, *files, "--in-interface", "flannel.1", "--src", "10.244.0.5:5000",
                 "--dst", "10.96.0.11:80")
    assert out["verdict"] == "DROP"  # flannel.1 -> flannel.1 is accepted by no FORWARD rule


def test_a_packet_delivered_to_the_node_names_the_port_and_what_the_rules_cannot_tell(
        dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _trace(capsys, "--node-dump", str(dump), "--src", "192.168.50.9:41000", "--dst", "192.168.50.2:22")
    assert out["verdict"] == "ACCEPT" and out["endpoints"] == [] and out["snat"] is None
    assert "delivered to a local socket on 22" in str(out["delivery"])
    assert "outside the rules" in str(out["delivery"])


def test_bad_node_dump_flags_are_refused_with_the_reason(
        dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packet = ["--src", "10.244.0.5:5000", "--dst", "10.96.0.11:80"]
    assert main(["trace", "--node-dump", str(dump), "--in-interface", "eth9", *packet]) != 0
    assert "no such interface" in capsys.readouterr().err
    assert main(["trace", "--iptables-save", str(dump / "iptables-save.txt"), "--in-interface", "eth0",
                 *packet]) != 0
    assert "--in-interface IF needs the node's interfaces" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["trace", "--node-dump", str(empty), *packet]) != 0
    assert "no iptables-save.txt" in capsys.readouterr().err
    (empty / "ip-addr.json").write_text("not json")
    assert main(["trace", "--node-dump", str(empty), "--iptables-save", str(dump / "iptables-save.txt"),
                 *packet]) != 0
    assert "not JSON" in capsys.readouterr().err


AFFINITY = """\
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-SEP-B - [0:0]
:KUBE-SVC-AFF - [0:0]
-A PREROUTING -d 10.96.0.20/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-AFF
-A KUBE-SEP-A -p tcp -m recent --set --name KUBE-SEP-A --mask 255.255.255.255 --rsource \
-m tcp -j DNAT --to-destination 10.244.0.5:8080
-A KUBE-SEP-B -p tcp -m recent --set --name KUBE-SEP-B --mask 255.255.255.255 --rsource \
-m tcp -j DNAT --to-destination 10.244.1.7:8080
-A KUBE-SVC-AFF -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A --mask 255.255.255.255 \
--rsource -j KUBE-SEP-A
-A KUBE-SVC-AFF -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-B --mask 255.255.255.255 \
--rsource -j KUBE-SEP-B
-A KUBE-SVC-AFF -m statistic --mode random --probability 0.5 -j KUBE-SEP-A
-A KUBE-SVC-AFF -j KUBE-SEP-B
COMMIT
""".replace("\\\n", "")


def test_recent_lists_from_the_dump_pin_a_client_to_its_endpoint(
        dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (dump / "iptables-save.txt").write_text(AFFINITY)
    packet = ["--src", "192.168.50.9:41000", "--dst", "10.96.0.20:80"]
    shutil.rmtree(dump / "xt_recent")
    out = _trace(capsys, "--node-dump", str(dump), *packet)
    assert [e["probability"] for e in out["endpoints"]] == [0.5, 0.5]  # type: ignore[union-attr]
    assert any("assumed empty" in n for n in out["notes"])  # type: ignore[union-attr]
    (dump / "xt_recent").mkdir()
    (dump / "xt_recent" / "KUBE-SEP-B").write_text(
        "src=192.168.50.9 ttl: 64 last_seen: 4298227566 oldest_pkt: 1 4298227566\n")
    out = _trace(capsys, "--node-dump", str(dump), *packet)
    assert [(e["address"], e["probability"]) for e in out["endpoints"]] == [  # type: ignore[union-attr]
        ("10.244.1.7:8080", 1.0)]


def test_a_node_dump_of_an_nftables_node_points_at_its_nft_ruleset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dump whose iptables-save.txt is empty but holds nft-ruleset.txt is not traced as an empty
    iptables node (a silent DROP): exit 2, naming --nft-ruleset and the file."""
    (tmp_path / "iptables-save.txt").write_text("")
    (tmp_path / "nft-ruleset.txt").write_text("table ip kube-proxy {\n}\n")
    argv = ["trace", "--node-dump", str(tmp_path), "--src", "10.0.0.5", "--dst", "10.96.0.10:80"]
    assert main(argv) == 2
    assert f"--nft-ruleset {tmp_path / 'nft-ruleset.txt'}" in capsys.readouterr().err
