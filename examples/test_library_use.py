"""Library use: a pytest test that runs kproxy's userspace proxy in process on a memory source.

Copy this into your own test suite: build a cluster with ``MemorySource``, start the proxy with
``running_userspace_proxy``, and talk to a Service through the address kproxy gives you.
"""

from __future__ import annotations

import asyncio

import pytest

from kproxy.daemon import UserspaceOptions, running_userspace_proxy
from kproxy.sources.memory import MemorySource

BACKENDS = ["127.0.55.1", "127.0.55.2"]
PORT = 18555


async def _backend(ip: str) -> asyncio.Server:
    """A pod: answers each connection with its own address."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(f"{ip}\n".encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, ip, PORT)


async def _ask(host: str, port: int) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"hello\n")
    answer = (await reader.readline()).decode().strip()
    writer.close()
    await writer.wait_closed()
    return answer


@pytest.mark.asyncio
async def test_service_round_robin_through_kproxy() -> None:
    """Connections to the Service are spread over both endpoints, then follow a scale-down."""
    servers = [await _backend(ip) for ip in BACKENDS]
    source = MemorySource()
    source.apply({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "demo"},
        "spec": {"clusterIP": "10.96.55.1", "ports": [{"port": 80, "targetPort": PORT}]},
    })
    source.set_endpoints("demo/web", [f"{ip}:{PORT}" for ip in BACKENDS])
    try:
        options = UserspaceOptions(min_sync_period_s=0.0)
        async with running_userspace_proxy(source, options=options) as running:
            host, port = running.listen_address("demo/web", "TCP")
            answers = {await _ask(host, port) for _ in range(4)}
            assert answers == set(BACKENDS)

            revision = running.engine.snapshot.revision
            source.set_endpoints("demo/web", [f"{BACKENDS[1]}:{PORT}"])
            await running.wait_synced(min_revision=revision + 1)
            assert {await _ask(host, port) for _ in range(4)} == {BACKENDS[1]}
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()
