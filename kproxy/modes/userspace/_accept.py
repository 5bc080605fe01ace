"""Accepting on a listening TCP socket, with a back-off when the process runs out of descriptors.

Theory of operation. asyncio's servers retry a failed accept() after a fixed second and log each
failure with a traceback through the loop's exception handler; uvloop's leave it to libuv. Both
differ, and neither lets the proxy check its connection caps before a transport exists. So the
listener reads the socket itself: ``loop.add_reader`` wakes :class:`AcceptLoop`, which accepts up
to :data:`ACCEPT_BATCH` connections per wake-up and hands each accepted socket to a callback. When
accept() fails for lack of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM) it stops reading and
retries after a delay that starts at :data:`ACCEPT_BACKOFF_MIN_S` and doubles up to
:data:`ACCEPT_BACKOFF_MAX_S`, as Go's ``net/http`` ``Server.Serve`` does for temporary accept
errors (5 ms doubling to 1 s). Meanwhile clients wait in the kernel's accept queue instead of the
loop spinning on a socket that stays readable.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from kproxy.modes.userspace.limits import Episode, out_of_resources

__all__ = ["ACCEPT_BACKOFF_MAX_S", "ACCEPT_BACKOFF_MIN_S", "ACCEPT_BATCH", "AcceptLoop"]

#: Connections accepted per readiness event, so one busy port cannot starve the loop (uvloop's
#: and asyncio's servers accept a bounded backlog per wake-up too).
ACCEPT_BATCH = 64
#: First delay after an accept() that failed for lack of descriptors, in seconds (Go's net/http).
ACCEPT_BACKOFF_MIN_S = 0.005
#: Longest delay between such retries, in seconds (Go's net/http).
ACCEPT_BACKOFF_MAX_S = 1.0


class AcceptLoop:
    """Accepts on ``sock`` (listening, non-blocking) and calls ``on_accept(conn, peer)`` per client.

    Args:
        sock: the listening socket; owned from here on, closed by :meth:`close`.
        on_accept: called with each accepted non-blocking socket and its peer address; it owns
            the socket.
        out_of_fds: the proxy's episode for running out of descriptors (logged once).
        name: the ServicePortName text, for the log.
    """

    __slots__ = ("_backoff_s", "_loop", "_name", "_on_accept", "_out_of_fds", "_retry", "_sock")

    def __init__(self, sock: socket.socket, on_accept: Callable[[socket.socket, tuple[str, int]], None], *,
                 out_of_fds: Episode, name: str) -> None:
        self._sock: socket.socket | None = sock
        self._on_accept = on_accept
        self._out_of_fds = out_of_fds
        self._name = name
        self._loop = asyncio.get_running_loop()
        self._backoff_s = 0.0
        self._retry: asyncio.TimerHandle | None = None
        self._loop.add_reader(sock.fileno(), self._ready)

    @property
    def backing_off_s(self) -> float:
        """The delay before the next accept() retry in seconds, or 0.0 when accepting normally."""
        return self._backoff_s if self._retry is not None else 0.0

    def _ready(self) -> None:
        sock = self._sock
        for _ in range(ACCEPT_BATCH):
            if sock is None or sock is not self._sock:
                return  # closed by a callback
            try:
                conn, peer = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if out_of_resources(exc):
                    self.back_off(exc, failed="accept")
                    return
                # ECONNABORTED and the like: that client left before we accepted it.
                continue
            self._backoff_s = 0.0
            conn.setblocking(False)
            self._on_accept(conn, peer)

    def back_off(self, exc: OSError, *, failed: str) -> None:
        """Stop accepting for the next back-off delay: ``failed`` (accept, dial) ran out of descriptors.

        The episode (logged once) is cleared by whoever next succeeds in full (a relayed
        connection), not by a bare accept, so accept-then-fail cycles never log twice.
        """
        if self._sock is None or self._retry is not None:
            return
        self._loop.remove_reader(self._sock.fileno())
        self._backoff_s = min(max(self._backoff_s * 2, ACCEPT_BACKOFF_MIN_S), ACCEPT_BACKOFF_MAX_S)
        self._out_of_fds.hit(failed=failed, service=self._name, error=exc.strerror or str(exc),
                             retry=f"accept again in {self._backoff_s * 1000:.0f} ms, doubling up to "
                                   f"{ACCEPT_BACKOFF_MAX_S:g} s while it lasts")
        self._retry = self._loop.call_later(self._backoff_s, self._resume)

    def _resume(self) -> None:
        self._retry = None
        if self._sock is not None:
            self._loop.add_reader(self._sock.fileno(), self._ready)
            self._ready()

    def close(self) -> None:
        """Stop accepting and close the socket (the kernel resets what waits in its accept queue)."""
        sock, self._sock = self._sock, None
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            sock.close()
