# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
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
        table = _read_map(address_map, 30, 1)
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
        listen = str(_read_map(address_map, 30, 1)[0]["listen"])
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
        table = _read_map(address_map, 30, 1)
        assert [row["service"] for row in table] == ["demo/web:http"]
        assert _ask(str(table[0]["listen"])) == "127.0.77.1:18080"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "demo/broken" in err and "spec.clusterIP" in err and str(manifest) in err


LOCAL_SERVICE = """\
apiVersion: v1
kind: Service
metadata: {name: local, namespace: demo}
spec:
  clusterIP: 10.96.8.8
  internalTrafficPolicy: Local
  ports: [{name: http, port: 8081, targetPort: 18080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-1, namespace: demo, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{name: http, port: 18080}]
endpoints:
- addresses: [127.0.77.2]
  nodeName: node-b
"""
CONFIG = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhostnameOverride: {node}\n"


def _try_ask(listen: str) -> str | None:
    """The backend's identity through ``listen``, or None when the connection is refused or closed."""
    try:
        return _ask(listen)
    except (OSError, IndexError):
        return None


def _listen_of(path: Path, service: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            table = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            table = []
        for row in table:
            if row["service"] == service:
                return str(row["listen"])
        time.sleep(0.05)
    raise AssertionError(f"{service} did not appear in the address map {path} within {timeout_s} s")


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([_kproxy(), "run", *argv, "--min-sync-period", "100ms", "--log-format", "json",
                             "--healthz-bind-address", "", "--metrics-bind-address", ""],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_sighup_reloads_the_config_file_and_the_manifests(tmp_path: Path, backends: IdentityServers) -> None:
    """After SIGHUP the same process serves a Service added to the manifest and the file's new node name."""
    manifest, config, address_map = tmp_path / "cluster.yaml", tmp_path / "kube-proxy.yaml", tmp_path / "map.json"
    manifest.write_text(LOCAL_SERVICE)
    config.write_text(CONFIG.format(node="node-a"))
    proc = _start(["--config", str(config), "--manifests", str(manifest), "--address-map", str(address_map)])
    try:
        local = _listen_of(address_map, "demo/local:http", 15)
        assert _try_ask(local) is None, "node-a has no local endpoint: internalTrafficPolicy Local refuses"
        config.write_text(CONFIG.format(node="node-b"))
        manifest.write_text(LOCAL_SERVICE + "---\n" + _manifest(["127.0.77.1"], 18080))
        proc.send_signal(signal.SIGHUP)
        web = _listen_of(address_map, "demo/web:http", 10)
        deadline = time.monotonic() + 5
        while _try_ask(local) != "127.0.77.2:18080" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _try_ask(local) == "127.0.77.2:18080", "the reloaded hostnameOverride made the endpoint local"
        assert _ask(web) == "127.0.77.1:18080"
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "configuration reloaded" in err


def test_sighup_with_a_broken_config_keeps_serving(tmp_path: Path, backends: IdentityServers) -> None:
    """A --config that no longer validates at SIGHUP is logged naming the field, and the old one keeps serving."""
    manifest, config, address_map = tmp_path / "cluster.yaml", tmp_path / "kube-proxy.yaml", tmp_path / "map.json"
    manifest.write_text(_manifest(["127.0.77.1"], 18080))
    config.write_text(CONFIG.format(node="node-a"))
    proc = _start(["--config", str(config), "--manifests", str(manifest), "--address-map", str(address_map)])
    try:
        web = _listen_of(address_map, "demo/web:http", 15)
        config.write_text(CONFIG.format(node="node-a") + "iptables: {masqueradeBit: 99}\n")
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.5)
        assert proc.poll() is None and _ask(web) == "127.0.77.1:18080"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "reload failed" in err and "iptables.masqueradeBit" in err


def test_second_sigint_cuts_the_drain_short(tmp_path: Path, backends: IdentityServers) -> None:
    """With a connection open, SIGINT starts a 60 s drain; a second SIGINT ends the process at once."""
    manifest, address_map = tmp_path / "cluster.yaml", tmp_path / "map.json"
    manifest.write_text(_manifest(["127.0.77.1"], 18080))
    proc = _start(["--manifests", str(manifest), "--address-map", str(address_map), "--drain-timeout", "60s"])
    host, _, port = _listen_of(address_map, "demo/web:http", 15).rpartition(":")
    with socket.create_connection((host, int(port)), timeout=3) as held:
        held.sendall(b"who\n")
        assert held.recv(4096).startswith(b"127.0.77.1:18080")
        proc.send_signal(signal.SIGINT)
        time.sleep(1.5)
        assert proc.poll() is None, "the first SIGINT drains the open connection"
        proc.send_signal(signal.SIGINT)
        cut = time.monotonic()
        _, err = proc.communicate(timeout=15)
        assert time.monotonic() - cut < 5.0
    assert proc.returncode == 0, err
    assert "drain cut short" in err


KUBEADM_CONFIG = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: ""
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"""


def test_kubeadm_config_with_manifests_serves_them(tmp_path: Path, backends: IdentityServers) -> None:
    """kubeadm 1.30's config.conf (a kubeconfig, an all-default logging block) with --manifests serves, quietly."""
    manifest, config, address_map = tmp_path / "cluster.yaml", tmp_path / "config.conf", tmp_path / "map.json"
    manifest.write_text(_manifest(["127.0.77.1"], 18080))
    config.write_text(KUBEADM_CONFIG)
    proc = _start(["--config", str(config), "--manifests", str(manifest), "--address-map", str(address_map)])
    try:
        assert _ask(_listen_of(address_map, "demo/web:http", 15)) == "127.0.77.1:18080"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert not [e for e in logged if e.get("event", "").startswith("--config field ignored")], err
    assert any("clientConnection.kubeconfig is not used" in e.get("event", "") for e in logged)


def test_manifests_from_stdin_are_served(tmp_path: Path, backends: IdentityServers) -> None:
    """`kproxy run -f -` serves the objects piped into it, and still serves them after a SIGHUP reload."""
    address_map = tmp_path / "map.json"
    proc = subprocess.Popen([_kproxy(), "run", "-f", "-", "--address-map", str(address_map), "--log-format", "json",
                             "--healthz-bind-address", "", "--metrics-bind-address", ""],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None
        proc.stdin.write(_manifest(["127.0.77.3"], 18080))
        proc.stdin.close()
        proc.stdin = None  # read to the end: communicate() below must not flush it
        listen = _listen_of(address_map, "demo/web:http", 15)
        assert _ask(listen) == "127.0.77.3:18080"
        proc.send_signal(signal.SIGHUP)  # a stream cannot be re-read: what was read is served again
        time.sleep(1.5)
        assert _ask(listen) == "127.0.77.3:18080"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err


def test_max_connections_per_service_resets_the_connection_over_the_cap(tmp_path: Path, backends: IdentityServers) -> None:
    """With --max-connections-per-service 1, a second connection while the first is open is reset
    without reaching an endpoint; once the first closes, a new one is served again."""
    manifest = tmp_path / "cluster.yaml"
    manifest.write_text(_manifest(["127.0.77.1"], 18080))
    address_map = tmp_path / "addresses.json"
    proc = subprocess.Popen(
        [_kproxy(), "run", "--manifests", str(manifest), "--address-map", str(address_map),
         "--max-connections-per-service", "1", "--log-format", "json", "--healthz-bind-address", "",
         "--metrics-bind-address", ""],
        stderr=subprocess.PIPE, text=True)
    try:
        listen = str(_read_map(address_map, 30, 1)[0]["listen"])
        host, _, port = listen.rpartition(":")
        held = socket.create_connection((host, int(port)), timeout=3)
        try:
            held.sendall(b"who\n")
            assert held.recv(4096).decode().split()[0] == "127.0.77.1:18080"
            try:
                over = _ask(listen)
            except (ConnectionResetError, IndexError):  # reset, or closed before any byte
                over = None
            assert over is None, f"the connection over the cap reached {over}"
        finally:
            held.close()
        deadline = time.monotonic() + 5
        answer = None
        while answer is None and time.monotonic() < deadline:
            try:
                answer = _ask(listen)
            except (ConnectionResetError, IndexError):  # the closed connection not yet counted out
                time.sleep(0.05)
        assert answer == "127.0.77.1:18080"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
