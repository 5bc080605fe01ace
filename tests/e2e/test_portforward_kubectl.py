"""Real kubectl against the harness API server: get, and port-forward over the WebSocket tunnel
and over SPDY (kubectl 1.33 both ways, kubectl 1.29 which speaks SPDY only)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kproxy.cluster import ClusterServer
from tests.e2e.portforward_support import (
    KUBECTL,
    PATH_IDS,
    PATHS,
    Pods,
    kubectl_env,
    kubectl_port_forward,
    loopback_pods,
    pod_manifest,
    roundtrip,
    service_manifest,
)

pytestmark = pytest.mark.skipif(not os.path.exists(KUBECTL), reason="needs kubectl")


@pytest.fixture
async def pods() -> AsyncIterator[Pods]:
    async with loopback_pods() as running:
        yield running


async def _server(pods: Pods, minor: int, tmp_path: Path) -> tuple[ClusterServer, Path]:
    server = ClusterServer(kube_minor=minor)
    server.apply(pod_manifest("web-0", pods), service_manifest(pods))
    await server.start()
    return server, server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.mark.parametrize("minor", [29, 33])
async def test_kubectl_get_lists_pods_services_and_endpointslices(pods: Pods, minor: int,
                                                                  tmp_path: Path) -> None:
    """kubectl get pods,svc,endpointslices prints the served objects, with the version /version names."""
    server, kubeconfig = await _server(pods, minor, tmp_path)
    server.apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                  "metadata": {"name": "web-abc", "namespace": "demo",
                               "labels": {"kubernetes.io/service-name": "web"}},
                  "addressType": "IPv4", "ports": [{"name": "http", "port": pods.echo}],
                  "endpoints": [{"addresses": ["127.0.0.1"]}]})
    try:
        proc = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", str(kubeconfig), "get", "pods,svc,endpointslices", "-A",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=kubectl_env())
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        text = out.decode()
        assert "pod/web-0" in text and "Running" in text
        assert "service/web" in text and "10.96.0.10" in text
        assert "endpointslice.discovery.k8s.io/web-abc" in text and "127.0.0.1" in text
        proc = await asyncio.create_subprocess_exec(
            KUBECTL, "--kubeconfig", str(kubeconfig), "version", "-o", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=kubectl_env())
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert f'"minor": "{minor}"' in out.decode()
    finally:
        await server.aclose()


@pytest.mark.parametrize(("minor", "websockets", "transport"), PATHS, ids=PATH_IDS)
async def test_kubectl_port_forward_carries_32_mib_each_way(pods: Pods, tmp_path: Path, minor: int,
                                                             websockets: str, transport: str) -> None:
    """32 MiB through kubectl's forward comes back byte for byte (SHA-256), over the expected transport."""
    server, kubeconfig = await _server(pods, minor, tmp_path)
    try:
        async with kubectl_port_forward(kubeconfig, "pod/web-0", f":{pods.echo}",
                                        websockets=websockets) as kc:
            payload = os.urandom(32 << 20)
            back = await roundtrip(kc.ports[0], payload, timeout_s=120)
            assert hashlib.sha256(back).hexdigest() == hashlib.sha256(payload).hexdigest()
        assert server.upgrades == [("demo/web-0", transport)]
    finally:
        await server.aclose()


@pytest.mark.parametrize(("minor", "websockets", "transport"), PATHS, ids=PATH_IDS)
async def test_kubectl_port_forward_serves_50_concurrent_connections(
        pods: Pods, tmp_path: Path, minor: int, websockets: str, transport: str) -> None:
    """Fifty connections at once through one kubectl forward each get their own bytes back."""
    server, kubeconfig = await _server(pods, minor, tmp_path)
    try:
        async with kubectl_port_forward(kubeconfig, "svc/web", ":80", websockets=websockets) as kc:
            payloads = [os.urandom(64 * 1024 + i) for i in range(50)]
            backs = await asyncio.gather(*(roundtrip(kc.ports[0], p) for p in payloads))
            assert backs == payloads
        assert len(server.upgrades) == 1 and server.upgrades[0][1] == transport
    finally:
        await server.aclose()


@pytest.mark.parametrize(("minor", "websockets", "transport"), PATHS, ids=PATH_IDS)
async def test_kubectl_port_forward_passes_half_close(pods: Pods, tmp_path: Path, minor: int,
                                                       websockets: str, transport: str) -> None:
    """The client's EOF reaches the pod while the reply direction stays open (the digest comes after it)."""
    server, kubeconfig = await _server(pods, minor, tmp_path)
    try:
        async with kubectl_port_forward(kubeconfig, "svc/web", ":81", websockets=websockets) as kc:
            payload = os.urandom(3 << 20)
            answer = await roundtrip(kc.ports[0], payload)
            assert answer.decode() == hashlib.sha256(payload).hexdigest()
    finally:
        await server.aclose()


@pytest.mark.parametrize(("minor", "websockets", "transport"), PATHS, ids=PATH_IDS)
async def test_refused_remote_port_gives_kubectls_error_and_other_forwards_keep_serving(
        pods: Pods, tmp_path: Path, minor: int, websockets: str, transport: str) -> None:
    """A refused pod port reaches kubectl as kubelet's error text (kubectl then drops its own
    connection, as client-go does since 1.23), and another forward to the same pod goes on."""
    server, kubeconfig = await _server(pods, minor, tmp_path)
    try:
        async with kubectl_port_forward(kubeconfig, "pod/web-0", f":{pods.echo}",
                                        websockets=websockets) as other, \
                kubectl_port_forward(kubeconfig, "pod/web-0", f":{pods.refused}",
                                     websockets=websockets) as kc:
            assert await roundtrip(kc.ports[0], b"anyone?") == b""
            await asyncio.wait_for(kc.proc.wait(), 30)
            err = await kc.stderr()
            assert f"error forwarding port {pods.refused} to pod web-0" in err
            assert "connection refused" in err
            assert "lost connection to pod" in err and kc.proc.returncode == 1
            assert await roundtrip(other.ports[0], b"still here") == b"still here"
    finally:
        await server.aclose()


@pytest.mark.parametrize(("minor", "websockets", "transport"), PATHS, ids=PATH_IDS)
async def test_deleting_the_pod_makes_kubectl_exit_1(pods: Pods, tmp_path: Path, minor: int,
                                                      websockets: str, transport: str) -> None:
    """When the pod is deleted its upgraded connections end and kubectl exits 1."""
    server, kubeconfig = await _server(pods, minor, tmp_path)
    try:
        async with kubectl_port_forward(kubeconfig, "pod/web-0", f":{pods.echo}",
                                        websockets=websockets) as kc:
            assert await roundtrip(kc.ports[0], b"hello") == b"hello"
            server.delete("Pod", "demo", "web-0")
            await asyncio.wait_for(kc.proc.wait(), 30)
            assert kc.proc.returncode == 1
            assert "lost connection to pod" in await kc.stderr()
    finally:
        await server.aclose()
