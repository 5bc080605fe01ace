# ruff: noqa: E501  (long test names are kept whole to stay readable)
"""``/debug/rules`` and ``/debug/trace`` of a running ``--kernel emulated`` node, and
``kproxy trace --from-run URL``, which asks it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_ipvs_run import _free_port, _get, _poll
from tests.scenarios import NODE, NODE_IP, PA, PB, REMOTE, cluster
from tests.unit.cli.trace_shares import address_shares

SVC4 = "172.30.0.44:80"  # ClusterIP with two local endpoints (tests/scenarios.py)


def _kproxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kproxy", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[str]:
    """A `kproxy run` of the scenario cluster in the mode the test's parameter names; yields its
    metrics server's URL once a sync has happened."""
    mode = getattr(request, "param", "iptables")
    manifests = tmp_path_factory.mktemp(mode) / "cluster.json"
    manifests.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster()}))
    metrics = _free_port()
    url = f"http://127.0.0.1:{metrics}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kproxy", "run", "--manifests", str(manifests), "--proxy-mode", mode,
         "--hostname-override", NODE, "--ip-families", "IPv4", "--node-ip", NODE_IP,
         "--min-sync-period", "0s", "--healthz-bind-address", "",
         "--metrics-bind-address", f"127.0.0.1:{metrics}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        want = "172.30.0.44" if mode != "userspace" else ""
        status, _ = _poll(f"{url}/debug/rules", lambda r: r[0] != 200 or want in r[1])
        assert status in (200, 404)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_debug_rules_are_the_running_iptables_save_and_trace_the_same_as_a_dump(running: str, tmp_path: Path) -> None:
    """/debug/rules?family=IPv4&dump=iptables-save is the live node's iptables-save; tracing that dump
    gives what /debug/trace and `kproxy trace --from-run` give: the Service's two endpoints at 1/2."""
    status, dump = _get(f"{running}/debug/rules?family=IPv4&dump=iptables-save")
    assert status == 200
    assert dump.startswith(("*", "# ")) and "-A KUBE-SERVICES" in dump and "172.30.0.44/32" in dump
    saved = tmp_path / "node.iptables-save"
    saved.write_text(dump)
    offline = _kproxy("trace", "--iptables-save", str(saved), "--node-ip", NODE_IP, "--src", "10.0.0.2:40000",
                      "--dst", SVC4, "--json")
    assert offline.returncode == 0, offline.stderr
    status, body = _get(f"{running}/debug/trace?src=10.0.0.2:40000&dst={SVC4}")
    assert status == 200
    live = json.loads(body)
    remote = _kproxy("trace", "--from-run", running, "--src", "10.0.0.2:40000", "--dst", SVC4, "--json")
    assert remote.returncode == 0, remote.stderr
    want = [{"address": f"{PA}:8080", "probability": 0.5}, {"address": f"{PB}:8080", "probability": 0.5}]
    assert address_shares(json.loads(offline.stdout)["endpoints"]) == address_shares(live["endpoints"]) == address_shares(json.loads(remote.stdout)["endpoints"]) == want
    assert live["node_ips"] == [NODE_IP]


def test_trace_from_run_prints_the_text_report_and_names_a_bad_query(running: str) -> None:
    """Without --json the report is text; a malformed --dst comes back as the run's 400 message, exit 1."""
    text = _kproxy("trace", "--from-run", running, "--src", "203.0.113.2", "--dst", "192.168.0.2:30003")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("packet: tcp 203.0.113.2:") and "verdict: ACCEPT" in text.stdout
    assert f"{REMOTE}:8080" in text.stdout
    bad = _kproxy("trace", "--from-run", running, "--src", "203.0.113.2", "--dst", "192.168.0.2")
    assert bad.returncode != 0
    assert "--dst" in bad.stderr and "port" in bad.stderr
    status, body = _get(f"{running}/debug/rules?dump=nft")
    assert status == 400 and "dump: expected one of iptables-save" in body


@pytest.mark.parametrize("running", ["ipvs"], indirect=True, scope="module")
def test_debug_rules_of_the_ipvs_mode_hold_ipvsadm_save_ipset_and_iptables(running: str) -> None:
    """The ipvs mode's /debug/rules has its three dumps, and --connections simulates connections."""
    status, rules = _get(f"{running}/debug/rules")
    assert status == 200
    assert "# IPv4: ipvsadm-save\n" in rules and "-A -t 172.30.0.44:80 -s rr" in rules
    assert "# IPv4: ipset-save\n" in rules and "create KUBE-CLUSTER-IP" in rules
    assert "# IPv4: iptables-save\n" in rules and "KUBE-SERVICES" in rules
    status, body = _get(f"{running}/debug/trace?src=10.0.0.2&dst={SVC4}&connections=10")
    assert status == 200
    shares = {e["address"]: e["probability"] for e in json.loads(body)["endpoints"]}
    assert shares == {f"{PA}:8080": 0.5, f"{PB}:8080": 0.5}


@pytest.mark.parametrize("running", ["userspace"], indirect=True, scope="module")
def test_debug_endpoints_of_a_userspace_run_say_where_to_look(running: str) -> None:
    """A run with no emulated node answers 404 and says why, and --from-run reports it."""
    status, body = _get(f"{running}/debug/rules")
    assert status == 404 and "userspace mode" in body
    out = _kproxy("trace", "--from-run", running, "--src", "10.0.0.2", "--dst", SVC4)
    assert out.returncode != 0 and "userspace mode" in out.stderr


def test_trace_from_run_that_is_not_running_names_the_url() -> None:
    """Nothing listening: the error names the URL and asks whether the run uses --kernel emulated."""
    url = f"http://127.0.0.1:{_free_port()}"
    out = _kproxy("trace", "--from-run", url, "--src", "10.0.0.2", "--dst", SVC4)
    assert out.returncode != 0
    assert url in out.stderr and "--kernel emulated" in out.stderr


@pytest.mark.parametrize("running", ["nftables"], indirect=True, scope="module")
def test_debug_rules_of_the_nftables_mode_list_its_table_and_trace_through_it(running: str, tmp_path: Path) -> None:
    """The nftables mode's /debug/rules is `nft list table ip kube-proxy`; it loads back into
    `kproxy trace --nft-ruleset` and gives the endpoints /debug/trace gives."""
    status, rules = _get(f"{running}/debug/rules?family=IPv4&dump=nft-ruleset")
    assert status == 200 and rules.startswith("table ip kube-proxy {") and "172.30.0.44" in rules
    status, body = _get(f"{running}/debug/trace?src=10.0.0.2:40000&dst={SVC4}")
    assert status == 200
    live = json.loads(body)["endpoints"]
    saved = tmp_path / "node.nft"
    saved.write_text(rules)
    offline = _kproxy("trace", "--nft-ruleset", str(saved), "--node-ip", NODE_IP, "--src", "10.0.0.2:40000",
                      "--dst", SVC4, "--json")
    assert offline.returncode == 0, offline.stderr
    assert address_shares(json.loads(offline.stdout)["endpoints"]) == address_shares(live)
    assert {e["address"] for e in live} == {f"{PA}:8080", f"{PB}:8080"}
