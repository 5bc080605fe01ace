"""``kproxy run --proxy-mode iptables`` serves health, metrics and health check node ports like userspace."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from kproxy.daemon.kernel import KernelRunOptions, serve_kernel_mode
from kproxy.model import IPFamily, NodeConfig
from kproxy.modes.iptables import IptablesConfig
from kproxy.observability import ObservabilityOptions
from kproxy.sources.kube import KubeSource, api_client_factory
from tests.fakeapi import FakeApiServer, endpoint_slice, service
from tests.fakeapi.harness import FAST


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(5)) as resp:
        return resp.status, await resp.text()


async def _poll(url: str, timeout_s: float = 10.0) -> tuple[int, str]:
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                return await _get(url)
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)


def _sample(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_iptables_mode_serves_healthz_metrics_and_health_check_node_ports() -> None:
    """serve_kernel_mode answers /healthz, /livez, /metrics (with its syncs) and a health check node port."""
    healthz, metrics, hc = _free_port(), _free_port(), _free_port()
    async with FakeApiServer() as api:
        lb = service("lb", "10.96.0.70", type="LoadBalancer", externalTrafficPolicy="Local",
                     healthCheckNodePort=hc)
        lb["spec"]["ports"][0]["nodePort"] = 30080
        api.apply(lb)
        api.apply(endpoint_slice("lb", ["10.244.0.5"], 9, node_name="node-a"))
        source = KubeSource(api_client_factory(master=api.url), options=FAST)
        options = KernelRunOptions(iptables=IptablesConfig(node_ips=("192.168.0.10",)), min_sync_period_s=0.0,
                                     sync_period_s=5.0)
        obs = ObservabilityOptions(healthz_bind_address=f"127.0.0.1:{healthz}",
                                   metrics_bind_address=f"127.0.0.1:{metrics}", proxy_mode="iptables")
        stop = asyncio.Event()
        node = NodeConfig(hostname="node-a", ip_families=(IPFamily.IPv4,))
        task = asyncio.create_task(serve_kernel_mode(source, node, options, stop, obs))
        try:
            status, body = await _poll(f"http://127.0.0.1:{hc}/")
            assert status == 200 and json.loads(body)["localEndpoints"] == 1
            assert (await _get(f"http://127.0.0.1:{healthz}/healthz"))[0] == 200
            assert (await _get(f"http://127.0.0.1:{healthz}/livez"))[0] == 200
            _, text = await _get(f"http://127.0.0.1:{metrics}/metrics")
            assert _sample(text, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 1
            assert (await _get(f"http://127.0.0.1:{metrics}/proxyMode"))[1] == "iptables"
        finally:
            stop.set()
            async with asyncio.timeout(10):
                await task


def test_run_iptables_command_serves_healthz(tmp_path: Path) -> None:
    """`kproxy run --proxy-mode iptables` (emulated kernel) answers /healthz 200 on the address given."""
    manifests = tmp_path / "svc.yaml"
    manifests.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n"
                         "spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kproxy", "run", "--manifests", str(manifests),
                             "--proxy-mode", "iptables", "--ip-families", "IPv4", "--hostname-override", "n1",
                             "--healthz-bind-address", f"127.0.0.1:{port}", "--metrics-bind-address", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        status = None
        while time.monotonic() < deadline and status is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                    sock.sendall(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
                    status = sock.recv(64).split(b" ")[1]
            except OSError:
                time.sleep(0.1)
        assert status == b"200"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
