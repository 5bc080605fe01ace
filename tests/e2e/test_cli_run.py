"""`kproxy run` as a real subprocess: it serves the manifests and follows edits to them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.identity import IdentityServers

SERVICE = """\
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: demo}}
spec:
  clusterIP: 10.96.7.7
  ports: [{{name: http, port: 8080, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: demo, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: {port}}}]
endpoints:
{endpoints}
"""


def _manifest(ips: list[str], port: int) -> str:
    eps = "\n".join(f"- addresses: [{ip}]" for ip in ips)
    return SERVICE.format(endpoints=eps, port=port)


def _kproxy() -> str:
    return str(Path(sys.executable).parent / "kproxy")


def _read_map(path: Path, timeout_s: float, want: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            table = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            table = []
        if len(table) >= want:
            return list(table)
        time.sleep(0.05)
    raise AssertionError(f"address map {path} did not get {want} entries in {timeout_s} s")


def _ask(listen: str) -> str:
    host, _, port = listen.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=3) as sock:
        sock.sendall(b"who\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.decode().split()[0]


@pytest.fixture
def backends() -> Iterator[IdentityServers]:
    """Identity servers on 127.0.77.1-3, port 18080."""
    with IdentityServers([("127.0.77.1", 18080), ("127.0.77.2", 18080), ("127.0.77.3", 18080)]) as s:
        yield s


def test_run_serves_manifest_and_follows_edits(tmp_path: Path, backends: IdentityServers) -> None:
    """A manifest edit (an endpoint added, one removed) is served within 3 s, without restart."""
    manifest = tmp_path / "cluster.yaml"
    manifest.write_text(_manifest(["127.0.77.1"], 18080))
    address_map = tmp_path / "addresses.json"
    proc = subprocess.Popen(
        [_kproxy(), "run", "--manifests", str(manifest), "--address-map", str(address_map),
         "--min-sync-period", "100ms", "--hostname-override", "node-a", "--log-format", "json"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        table = _read_map(address_map, 10, 1)
        assert table[0]["service"] == "demo/web:http"
        assert table[0]["cluster_ip"] == "10.96.7.7"
        listen = str(table[0]["listen"])
        assert {_ask(listen) for _ in range(3)} == {"127.0.77.1:18080"}

        manifest.write_text(_manifest(["127.0.77.2", "127.0.77.3"], 18080))
        edited = time.monotonic()
        seen: set[str] = set()
        while time.monotonic() - edited < 3.0:
            seen = {_ask(listen) for _ in range(4)}
            if seen == {"127.0.77.2:18080", "127.0.77.3:18080"}:
                break
            time.sleep(0.05)
        assert seen == {"127.0.77.2:18080", "127.0.77.3:18080"}, "the edit was not served within 3 s"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err


def test_run_keeps_serving_when_a_file_breaks(tmp_path: Path, backends: IdentityServers) -> None:
    """A manifest that stops parsing keeps its last good objects and the error names the file."""
    manifest = tmp_path / "cluster.yaml"
    manifest.write_text(_manifest(["127.0.77.1"], 18080))
    address_map = tmp_path / "addresses.json"
    proc = subprocess.Popen(
        [_kproxy(), "run", "--manifests", str(manifest), "--address-map", str(address_map),
         "--min-sync-period", "100ms", "--log-format", "json"],
        stderr=subprocess.PIPE, text=True)
    try:
        listen = str(_read_map(address_map, 10, 1)[0]["listen"])
        manifest.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: [unclosed\n")
        time.sleep(1.5)
        assert _ask(listen) == "127.0.77.1:18080"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert str(manifest) in err


def test_invalid_service_is_reported_and_others_served(tmp_path: Path, backends: IdentityServers) -> None:
    """One invalid Service is logged with file, object and field; the valid one is still served."""
    manifest = tmp_path / "cluster.yaml"
    bad = ("---\napiVersion: v1\nkind: Service\nmetadata: {name: broken, namespace: demo}\n"
           "spec:\n  clusterIP: 10.96.7.300\n  ports: [{port: 80}]\n")
    manifest.write_text(_manifest(["127.0.77.1"], 18080) + bad)
    address_map = tmp_path / "addresses.json"
    proc = subprocess.Popen(
        [_kproxy(), "run", "--manifests", str(manifest), "--address-map", str(address_map),
         "--min-sync-period", "100ms", "--log-format", "json"],
        stderr=subprocess.PIPE, text=True)
    try:
        table = _read_map(address_map, 10, 1)
        assert [row["service"] for row in table] == ["demo/web:http"]
        assert _ask(str(table[0]["listen"])) == "127.0.77.1:18080"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "demo/broken" in err and "spec.clusterIP" in err and str(manifest) in err
