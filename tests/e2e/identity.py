"""Identity servers for end-to-end tests: each answers a TCP line with ``<ip:port> <line>``.

They run in a thread with their own event loop so that synchronous tests (and subprocess
tests) can use them; every server binds a loopback address the test chooses.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

from kproxy.testing.harness import TcpIdentity, UdpIdentity


class IdentityServers:
    """TCP and UDP identity servers on the given ``(ip, port)`` pairs, in a background thread."""

    def __init__(self, addresses: list[tuple[str, int]], *, udp: bool = False) -> None:
        self._addresses = addresses
        self._udp = udp
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._closers: list[object] = []

    async def _start(self) -> None:
        for ip, port in self._addresses:
            identity = f"{ip}:{port}".encode()
            server = await self._loop.create_server(lambda i=identity: TcpIdentity(i), ip, port,
                                                    reuse_address=True)
            self._closers.append(server)
            if self._udp:
                transport, _ = await self._loop.create_datagram_endpoint(
                    lambda i=identity: UdpIdentity(i), local_addr=(ip, port))
                self._closers.append(transport)

    async def _stop(self) -> None:
        for closer in self._closers:
            closer.close()  # type: ignore[attr-defined]

    def __enter__(self) -> IdentityServers:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
