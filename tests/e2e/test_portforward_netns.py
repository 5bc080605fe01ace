"""Port-forward into a Pod's network namespace (root): the dial happens inside it, as CRI does."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kproxy.cluster import NETNS_ANNOTATION, ClusterServer
from kproxy.portforward.client import port_forward
from kproxy.portforward.http import load_kubeconfig
from tests.conftest import require_kernel
from tests.e2e.portforward_support import KUBECTL, Pods, kubectl_port_forward, pod_manifest, roundtrip
from tests.kernel.netns import netns

pytestmark = pytest.mark.kernel

_ECHO = """
import asyncio, sys
async def echo(r, w):
    while d := await r.read(65536):
        w.write(d)
        await w.drain()
    w.write_eof()
    w.close()
async def main():
    servers = [await asyncio.start_server(echo, host, int(port)) for host, port in
               (a.rsplit(":", 1) for a in sys.argv[1:])]
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""
_PORT, _POD_IP_ONLY = 18181, 18182
_POD_IP = "10.250.0.7"


@pytest.fixture
async def pod_netns(tmp_path: Path) -> AsyncIterator[str]:
    """A namespace with lo up and the pod IP on it, an echo server on 127.0.0.1:18181 and one
    bound only to the pod IP on 18182."""
    require_kernel("nsenter")
    with netns("pf") as name:
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", name, "ip", "addr", "add", f"{_POD_IP}/32", "dev", "lo")
        assert await proc.wait() == 0
        script = tmp_path / "echo.py"
        script.write_text(_ECHO, encoding="utf-8")
        server = await asyncio.create_subprocess_exec(
            "nsenter", f"--net=/run/netns/{name}", sys.executable, str(script),
            f"127.0.0.1:{_PORT}", f"{_POD_IP}:{_POD_IP_ONLY}", stdout=asyncio.subprocess.PIPE)
        try:
            assert server.stdout is not None
            assert (await asyncio.wait_for(server.stdout.readline(), 30)).strip() == b"ready"
            yield name
        finally:
            server.kill()
            await server.wait()


def _pod(name: str) -> dict[str, object]:
    pods = Pods(echo=_PORT, digest=_POD_IP_ONLY, push=_PORT, refused=_POD_IP_ONLY)
    return pod_manifest("db-0", pods, ip=_POD_IP, annotations={NETNS_ANNOTATION: name})


async def test_kproxy_client_reaches_localhost_inside_the_pod_netns(pod_netns: str, tmp_path: Path) -> None:
    """Bytes reach the server on the namespace's own 127.0.0.1 (nothing listens on the host's)."""
    async with ClusterServer() as server:
        server.apply(_pod(pod_netns))
        endpoint = load_kubeconfig(server.write_kubeconfig(tmp_path / "kc"))
        async with port_forward(endpoint, "pod/db-0", [f":{_PORT}"], namespace="demo") as fwd:
            payload = os.urandom(4 << 20)
            back = await roundtrip(fwd.ports[0].local, payload)
            assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()


async def test_app_bound_only_to_the_pod_ip_is_unreachable(pod_netns: str, tmp_path: Path) -> None:
    """As with CRI, the dial goes to localhost in the namespace: a pod-IP-only app is refused,
    with containerd's words in the error stream."""
    errors: list[str] = []
    async with ClusterServer() as server:
        server.apply(_pod(pod_netns))
        endpoint = load_kubeconfig(server.write_kubeconfig(tmp_path / "kc"))
        async with port_forward(endpoint, "pod/db-0", [f":{_POD_IP_ONLY}"], namespace="demo",
                                on_error=lambda _l, _r, m: errors.append(m)) as fwd:
            assert await roundtrip(fwd.ports[0].local, b"hello") == b""
            for _ in range(100):
                if errors:
                    break
                await asyncio.sleep(0.05)
    assert len(errors) == 1
    where = f"failed to connect to localhost:{_POD_IP_ONLY} inside namespace /run/netns/{pod_netns}"
    assert where in errors[0]
    assert "connection refused" in errors[0]


@pytest.mark.skipif(not os.path.exists(KUBECTL), reason="needs kubectl")
@pytest.mark.parametrize("websockets", ["true", "false"], ids=["websocket-tunnel", "spdy"])
async def test_kubectl_forwards_into_the_pod_netns(pod_netns: str, tmp_path: Path, websockets: str) -> None:
    """Real kubectl's forward reaches the namespaced pod over both transports."""
    async with ClusterServer(kube_minor=33) as server:
        server.apply(_pod(pod_netns))
        kubeconfig = server.write_kubeconfig(tmp_path / "kc")
        async with kubectl_port_forward(kubeconfig, "pod/db-0", f":{_PORT}", websockets=websockets) as kc:
            payloads = [os.urandom(100_000) for _ in range(10)]
            assert await asyncio.gather(*(roundtrip(kc.ports[0], p) for p in payloads)) == payloads
