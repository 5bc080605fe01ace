"""The node side of port-forward: dial a Pod's port, and relay a TCP connection over a stream.

Theory of operation
-------------------
CRI runtimes forward a port by entering the Pod's network namespace and connecting to
``localhost:PORT`` there (containerd ``sandbox_portforward_linux.go``: ``netns.Do`` and a
dial; older kubelets ran ``nsenter -t PID -n socat - TCP4:localhost:PORT``). The
:func:`dial_in_netns` dialer does the same: a fresh thread ``setns()``s into
``/run/netns/NAME`` (as ``nsenter --net=`` does), creates and connects the socket there, and
returns; the socket stays in that namespace, and the relay is plain asyncio. So an app bound only
to the Pod IP is unreachable this way, as with the kubelet. A Pod whose IP is a loopback
address (the example cluster's) is dialled directly by :func:`dial_loopback`, rootless.

:func:`relay` copies a TCP connection and a SPDY data stream both ways with half-close: EOF one
way sends FIN (or ``write_eof``) that way only, and each direction awaits the other side's
backpressure (``drain()``, the stream window).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import socket
import threading
from collections.abc import Awaitable, Callable

from kproxy.errors import PortForwardError
from kproxy.portforward.connection import READ_CHUNK, SpdyStream

__all__ = ["CLONE_NEWNET", "Dialer", "dial_in_netns", "dial_loopback", "relay"]

CLONE_NEWNET = 0x40000000
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Dialer = Callable[[int], Awaitable[Connection]]
# Bounded dial: the kubelet has none of its own; 10 s is client-go's dial timeout.
DIAL_TIMEOUT_S = 10.0


def dial_loopback(host: str) -> Dialer:
    """A dialer that connects to ``host:PORT`` directly (Pods on loopback addresses)."""

    async def dial(port: int) -> Connection:
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, port, limit=READ_CHUNK),
                                          DIAL_TIMEOUT_S)
        except (TimeoutError, OSError) as err:
            raise _dial_error(f"dial tcp {host}:{port}", err) from err

    return dial


def _dial_error(what: str, err: BaseException) -> OSError:
    """Go's wording for a failed dial (``dial tcp4 127.0.0.1:80: connect: connection refused``),
    which is what the kubelet's runtimes pass on in the error stream."""
    if isinstance(err, TimeoutError):
        return OSError(errno.ETIMEDOUT, f"{what}: i/o timeout")
    code = err.errno if isinstance(err, OSError) and err.errno else errno.EIO
    return OSError(code, f"{what}: connect: {os.strerror(code).lower()}")


def _connect_in_netns(netns_path: str, port: int, timeout_s: float) -> socket.socket:
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(netns_path, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {netns_path}: {os.strerror(err)}")
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout_s)
                sock.connect(("127.0.0.1", port))
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
            return sock
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:  # pragma: no cover - back to our own namespace
                os.abort()
    finally:
        os.close(target)
        os.close(own)


def dial_in_netns(netns_path: str) -> Dialer:
    """A dialer that connects to ``localhost:PORT`` inside the network namespace at
    ``netns_path`` (``/run/netns/NAME``), from a thread that ``setns()``s there (needs root).

    Raises (from the dialer):
        OSError: the namespace cannot be entered, or the connection is refused or times out.
    """

    async def dial(port: int) -> Connection:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[socket.socket] = loop.create_future()

        def work() -> None:
            try:
                sock = _connect_in_netns(netns_path, port, DIAL_TIMEOUT_S)
            except BaseException as err:  # handed to the loop, never lost
                loop.call_soon_threadsafe(_settle, fut, None, err)
                return
            loop.call_soon_threadsafe(_settle, fut, sock, None)

        # A fresh thread per dial: its namespace switch can never leak into a pooled thread.
        threading.Thread(target=work, name=f"netns-dial-{port}", daemon=True).start()
        try:
            sock = await fut
        except (TimeoutError, OSError) as err:
            # containerd's wording (sandbox_portforward_linux.go): the dial happens in the netns.
            raise _dial_error(f"failed to connect to localhost:{port} inside namespace {netns_path}, "
                              f"IPv4: dial tcp4 127.0.0.1:{port}", err) from err
        return await asyncio.open_connection(sock=sock, limit=READ_CHUNK)

    return dial


def _settle(fut: asyncio.Future[socket.socket], sock: socket.socket | None,
            err: BaseException | None) -> None:
    if fut.cancelled():
        if sock is not None:
            sock.close()
        return
    if err is not None:
        fut.set_exception(err)
    elif sock is not None:
        fut.set_result(sock)


async def relay(stream: SpdyStream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader``/``writer`` (a TCP connection) and ``stream`` both ways until both ends
    finish; EOF is passed on as a half-close. Returns when both directions are done or either
    side breaks; the TCP connection is closed then."""

    async def tcp_to_stream() -> None:
        try:
            while chunk := await reader.read(READ_CHUNK):
                await stream.write(chunk)
        except (ConnectionError, OSError, PortForwardError):
            stream.reset()
            return
        stream.close()

    async def stream_to_tcp() -> None:
        try:
            while chunk := await stream.read():
                writer.write(chunk)
                await writer.drain()
            if stream.reset_status is not None:
                writer.transport.abort()
                return
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            stream.reset()

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(tcp_to_stream())
            tg.create_task(stream_to_tcp())
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError, asyncio.TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
