"""``kproxy run --proxy-mode ipvs``: keeps an emulated node's IPVS in sync, with health and metrics."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.scenarios import NODE, cluster

_DEADLINE_S = 20.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _poll(url: str, ok: object) -> tuple[int, str]:
    deadline = time.monotonic() + _DEADLINE_S
    last: tuple[int, str] = (0, "")
    while time.monotonic() < deadline:
        try:
            last = _get(url)
        except OSError:
            time.sleep(0.1)
            continue
        if ok(last):  # type: ignore[operator]
            return last
        time.sleep(0.1)
    return last


def _syncs(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("kubeproxy_sync_proxy_rules_duration_seconds_count"))


def test_run_ipvs_emulated_serves_health_and_metrics_and_follows_changes(tmp_path: Path) -> None:
    """`kproxy run --proxy-mode ipvs` programs an emulated node (debug 'ipvs synced'), answers /healthz,
    /metrics with its syncs and /proxyMode ipvs, resyncs when the manifests change, and exits 0 on SIGTERM."""
    manifests = tmp_path / "cluster.json"
    docs = cluster()
    manifests.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    healthz, metrics = _free_port(), _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kproxy", "run", "--manifests", str(manifests), "--proxy-mode", "ipvs",
         "--hostname-override", NODE, "--ip-families", "IPv4", "--node-ip", "192.168.0.2",
         "--min-sync-period", "0s", "--sync-period", "1s", "--log-level", "debug",
         "--healthz-bind-address", f"127.0.0.1:{healthz}", "--metrics-bind-address", f"127.0.0.1:{metrics}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        status, _ = _poll(f"http://127.0.0.1:{healthz}/healthz", lambda r: r[0] == 200)
        assert status == 200
        assert _get(f"http://127.0.0.1:{metrics}/proxyMode") == (200, "ipvs")
        _, text = _poll(f"http://127.0.0.1:{metrics}/metrics", lambda r: _syncs(r[1]) >= 1)
        first = _syncs(text)
        assert first >= 1
        kept = [d for d in docs if d["metadata"]["namespace"] != "ns1"]  # type: ignore[index]
        manifests.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": kept}))
        _, text = _poll(f"http://127.0.0.1:{metrics}/metrics", lambda r: _syncs(r[1]) > first + 1)
        assert _syncs(text) > first + 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err
    counts = [int(m) for m in re.findall(r"ipvs synced.*?virtual_servers=(\d+)", err)]
    assert counts and counts[0] > counts[-1] > 0, counts  # ns1's virtual servers went away
