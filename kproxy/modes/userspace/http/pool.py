"""Keep-alive upstream connections, one idle pool per endpoint (nginx's ``keepalive`` in an upstream).

ingress-nginx keeps ``upstream-keepalive-connections`` (320) idle connections per worker for
``upstream-keepalive-timeout`` (60 s); here each endpoint keeps at most :data:`MAX_IDLE_PER_NODE`
for :data:`IDLE_TIMEOUT_S`. A pooled connection the server has closed (EOF seen while idle) is
dropped instead of reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

__all__ = ["IDLE_TIMEOUT_S", "MAX_IDLE_PER_NODE", "UpstreamPool", "split_node"]

MAX_IDLE_PER_NODE = 64
IDLE_TIMEOUT_S = 60.0

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def split_node(node: str) -> tuple[str, int]:
    """``"10.0.0.1:80"`` or ``"fd00::1:80"`` (ingress-nginx's unbracketed form) into host and port."""
    host, _, port = node.rpartition(":")
    return host.strip("[]"), int(port)


class UpstreamPool:
    """Idle keep-alive connections per node (``address:port``).

    Args:
        connect_timeout_s: how long a new connection may take (``proxy-connect-timeout``).
    """

    def __init__(self, *, connect_timeout_s: float = 5.0) -> None:
        self._idle: dict[str, deque[tuple[Conn, float]]] = {}
        self._connect_timeout_s = connect_timeout_s

    async def get(self, node: str) -> Conn:
        """An idle connection to ``node`` or a new one.

        Raises:
            OSError: the connect failed or timed out (``TimeoutError`` is an OSError).
        """
        idle = self._idle.get(node)
        now = time.monotonic()
        while idle:
            conn, since = idle.pop()
            if conn[0].at_eof() or conn[1].is_closing() or now - since > IDLE_TIMEOUT_S:
                conn[1].close()
                continue
            return conn
        host, port = split_node(node)
        return await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 18),
                                      self._connect_timeout_s)

    def put(self, node: str, conn: Conn) -> None:
        """Return a connection whose exchange completed and that stays open."""
        idle = self._idle.setdefault(node, deque())
        if len(idle) >= MAX_IDLE_PER_NODE or conn[1].is_closing():
            conn[1].close()
            return
        idle.append((conn, time.monotonic()))

    def discard(self, conn: Conn) -> None:
        """Close a connection that must not be reused."""
        conn[1].close()

    async def aclose(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for (_, w), _ in idle:
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
        self._idle.clear()
