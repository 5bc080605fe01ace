"""The older WebSocket protocol, v4.channel.k8s.io, served by the harness API server (a real
aiohttp WebSocket client speaks it, as the official Python client does)."""

from __future__ import annotations

import struct

import aiohttp

from kproxy.cluster import ClusterServer
from tests.e2e.portforward_support import loopback_pods, pod_manifest


async def test_v4_channels_carry_data_with_port_prefixes_and_errors() -> None:
    """Both channels of each port open with its little-endian port; data round-trips on channel
    2i; a refused port's error text arrives on channel 2i+1."""
    async with loopback_pods() as pods, ClusterServer() as server:
        server.apply(pod_manifest("web-0", pods))
        url = (f"{server.url}/api/v1/namespaces/demo/pods/web-0/portforward"
               f"?ports={pods.echo}&ports={pods.refused}")
        async with aiohttp.ClientSession() as http, \
                http.ws_connect(url, protocols=("v4.channel.k8s.io",)) as ws:
            assert ws.protocol == "v4.channel.k8s.io"
            firsts = [await ws.receive_bytes(timeout=5) for _ in range(4)]
            assert sorted(firsts) == sorted([
                bytes([0]) + struct.pack("<H", pods.echo), bytes([1]) + struct.pack("<H", pods.echo),
                bytes([2]) + struct.pack("<H", pods.refused), bytes([3]) + struct.pack("<H", pods.refused)])
            await ws.send_bytes(b"\x00hello v4")
            got: dict[int, bytes] = {}
            while b"hello v4" not in got.get(0, b"") or 3 not in got:
                msg = await ws.receive_bytes(timeout=5)
                got[msg[0]] = got.get(msg[0], b"") + msg[1:]
            assert got[0] == b"hello v4"
            assert f"error forwarding port {pods.refused} to pod web-0".encode() in got[3]
    assert server.upgrades == [("demo/web-0", "v4.channel.k8s.io")]
