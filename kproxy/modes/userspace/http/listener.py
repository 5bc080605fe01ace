"""The Ingress listener (``--ingress-bind-address``): HTTP/1.1 as ingress-nginx proxies it.

Theory of operation. One asyncio server; per client connection a loop reads one request at a
time (keep-alive), routes it with the current :class:`~.routing.RouteTable` and proxies it:

1. No location: nginx's 404 from the default server. A backend without endpoints: 503
   (``balancer.lua`` ``rewrite``). ``Expect: 100-continue`` is answered here, as nginx does.
2. Attempts (``proxy_next_upstream error timeout``, ``proxy-next-upstream-tries`` 3): the
   backend's chooser picks a node (cookie affinity may add a ``Set-Cookie``); a connect error or
   timeout marks the node tried and the next attempt runs ``balance()`` again with
   ``last_failed``. Nothing is sent upstream before a connection is up, so only connects retry.
3. The request goes out as HTTP/1.1 on a pooled keep-alive connection of that node, with
   ingress-nginx's headers (``Host``, ``X-Request-ID`` kept or made, ``X-Real-IP``,
   ``X-Forwarded-For`` = the client address, ``X-Forwarded-Host``/``-Port``/``-Proto``/
   ``-Scheme``, ``X-Scheme``, ``X-Original-Forwarded-For``) and hop-by-hop headers dropped; the
   body streams with backpressure (each piece is drained before the next is read), chunked
   bodies are re-chunked.
4. The response streams back the same way, with the cookies added. An upstream that fails
   before its response head gives 502; after it, the client connection is closed. A connection
   whose response completed and that both sides keep alive goes back to the pool.
5. ``Upgrade`` (WebSocket): the request goes out with ``Connection: upgrade``; on ``101`` the
   bytes are spliced both ways until either side closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from kproxy.errors import InvalidArgument
from kproxy.model import Snapshot
from kproxy.modes.userspace.http._wire import (
    READ_SIZE,
    Body,
    End,
    Head,
    MessageReader,
    error_response,
    ok_chunk,
)
from kproxy.modes.userspace.http.choosers import Attempt, IngressChooser
from kproxy.modes.userspace.http.hashby import HashByRequest
from kproxy.modes.userspace.http.pool import Conn, UpstreamPool
from kproxy.modes.userspace.http.routing import DEFAULT_SERVER, RouteTable

__all__ = ["DEFAULT_NEXT_UPSTREAM_TRIES", "IngressListener", "IngressOptions"]

log = structlog.get_logger("kproxy.http")

#: What choosers that never read request variables get (only upstream-hash-by reads them).
_NO_REQUEST = HashByRequest(request_uri="", remote_addr="")
#: ingress-nginx's ``proxy-next-upstream-tries`` default.
DEFAULT_NEXT_UPSTREAM_TRIES = 3
_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te",
                  b"upgrade", b"proxy", b"expect", b"host", b"x-request-id", b"x-real-ip", b"x-forwarded-for",
                  b"x-forwarded-host", b"x-forwarded-port", b"x-forwarded-proto", b"x-forwarded-scheme",
                  b"x-scheme", b"x-original-forwarded-for"})
_RESPONSE_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding"})


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressOptions:
    """How the listener runs.

    Attributes:
        host, port: where it listens (``--ingress-bind-address``).
        ingress_class: the class served (``--ingress-class``).
        connect_timeout_s: ``proxy-connect-timeout`` (5 s); read_timeout_s ``proxy-read-timeout`` (60 s).
        next_upstream_tries: attempts per request (3).
    """

    host: str
    port: int
    ingress_class: str = "nginx"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    next_upstream_tries: int = DEFAULT_NEXT_UPSTREAM_TRIES


class _UpstreamFailed(Exception):
    """The upstream broke before a response head: answer 502."""


class IngressListener:
    """The HTTP plane's consumer: ``await apply(snapshot)`` on every sync, ``aclose()`` at the end.

    Args:
        options: where and how to listen.
        rng: randomness for balanced keys and persistent picks (default: a fresh ``Random``).
        wall_clock: wall-clock seconds (``ngx.now()`` for keys, cookie Expires).

    Raises:
        InvalidArgument: a port outside 0..65535 or tries below 1.
    """

    description = "http"

    def __init__(self, options: IngressOptions, *, rng: random.Random | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        if not 0 <= options.port <= 65535 or options.next_upstream_tries < 1:
            raise InvalidArgument(f"bad ingress listener options: {options!r}")
        self.options = options
        self._rng = rng or random.Random()
        self._now = wall_clock
        self._table = RouteTable({}, {})
        self._choosers: dict[str, IngressChooser] = {}
        self._pool = UpstreamPool(connect_timeout_s=options.connect_timeout_s)
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self.bound: tuple[str, int] | None = None

    async def start(self) -> None:
        """Bind and start serving (before the first snapshot, everything is 404)."""
        self._server = await asyncio.start_server(self._client, self.options.host, self.options.port,
                                                  limit=READ_SIZE, backlog=1024)
        sock = self._server.sockets[0].getsockname()
        self.bound = (sock[0], sock[1])
        log.info("ingress listener started", address=f"{sock[0]}:{sock[1]}",
                 ingress_class=self.options.ingress_class)

    async def apply(self, snapshot: Snapshot) -> None:
        """Route with ``snapshot`` from now on; balancers are rebuilt only for changed backends."""
        table = RouteTable.build(snapshot, ingress_class=self.options.ingress_class)
        choosers: dict[str, IngressChooser] = {}
        for name, backend in table.backends.items():
            old = self._choosers.get(name)
            if old is not None and old.backend == backend:
                choosers[name] = old
            elif backend.nodes:
                choosers[name] = IngressChooser(backend, rng=self._rng, worker_pid=os.getpid())
        for problem in table.problems:
            log.warning("ingress backend not found", problem=problem)
        self._table, self._choosers = table, choosers

    async def aclose(self) -> None:
        """Stop accepting, cut open client connections, close the pool."""
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        for task in list(self._clients):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            await self._server.wait_closed()
        await self._pool.aclose()

    # -- one client connection ---------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        peer = writer.get_extra_info("peername") or ("", 0)
        local = writer.get_extra_info("sockname") or ("", 0)
        requests = MessageReader(reader)
        try:
            while True:
                try:
                    event = await requests.next()
                except Exception:  # httptools.HttpParserError: malformed request
                    writer.write(error_response(400, keep_alive=False))
                    break
                if event is None:
                    break
                if not isinstance(event, Head):
                    continue
                keep = await self._one_request(event, requests, writer, peer, local)
                if not keep:
                    break
        except (TimeoutError, ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            pass  # aclose() cut this connection; the task ends here, its outermost frame
        finally:
            self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _skip_body(self, requests: MessageReader) -> bool:
        while True:
            ev = await requests.next()
            if ev is None:
                return False
            if isinstance(ev, End):
                return True

    async def _one_request(self, head: Head, requests: MessageReader, writer: asyncio.StreamWriter,
                           peer: tuple[str, int], local: tuple[str, int]) -> bool:
        """Proxy one request; whether the client connection stays open."""
        client_keep = head.keep_alive and head.version == "1.1"
        picked = await self._connect(head, peer, local)
        if isinstance(picked, int):
            ok = await self._skip_body(requests)
            keep = client_keep and ok and picked != 502
            writer.write(error_response(picked, keep_alive=keep))
            await writer.drain()
            return keep
        conn, node, set_cookies = picked
        if any(k.lower() == b"expect" and v.lower() == b"100-continue" for k, v in head.headers):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        host = next((v.decode("latin-1") for k, v in head.headers if k.lower() == b"host"), "")
        out = self._request_head(head, host, peer, local)
        try:
            return await self._exchange(head, requests, writer, conn, node, out, set_cookies, client_keep)
        except _UpstreamFailed:
            self._pool.discard(conn)
            writer.write(error_response(502, keep_alive=False))
            await writer.drain()
            return False

    async def _connect(self, head: Head, peer: tuple[str, int],
                       local: tuple[str, int]) -> tuple[Conn, str, tuple[str, ...]] | int:
        """Route ``head`` and connect to a node: ``(connection, node, Set-Cookie values)``, or the
        status to answer (404 nothing matched, 503 no endpoints, 502 every attempt failed)."""
        url = head.url.decode("latin-1")
        path = url.split("?", 1)[0]
        headers = head.headers
        host = next((v.decode("latin-1") for k, v in headers if k.lower() == b"host"), "")
        host_name = _host_name(host)
        match = self._table.route(host, path)
        if match.location is None or match.backend is None:
            return 404
        chooser = self._choosers.get(match.backend.name)
        if chooser is None:
            return 503
        cookie = "; ".join(v.decode("latin-1") for k, v in headers if k.lower() == b"cookie") or None
        user_agent = next((v.decode("latin-1") for k, v in headers if k.lower() == b"user-agent"), "")
        hb = (HashByRequest(request_uri=url, remote_addr=peer[0], host=host_name,
                            method=head.method.decode("latin-1"),
                            headers=tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in headers))
              if chooser.hashes_requests else _NO_REQUEST)
        tried: list[str] = []
        set_cookies: tuple[str, ...] = ()
        for _ in range(self.options.next_upstream_tries):
            choice = chooser.choose(Attempt(
                host=host_name, default_server=match.server == DEFAULT_SERVER,
                location_path=match.location.path, cookie_header=cookie, request=hb, user_agent=user_agent,
                last_failed=bool(tried), tried=tried, now_s=self._now()))
            if choice.node is None:
                break
            set_cookies = choice.set_cookies or set_cookies
            try:
                return await self._pool.get(choice.node), choice.node, set_cookies
            except OSError as err:
                log.info("upstream connect failed", backend=match.backend.name, node=choice.node,
                         error=str(err))
                tried.append(choice.node)
        return 502

    def _request_head(self, head: Head, host: str, peer: tuple[str, int], local: tuple[str, int]) -> bytes:
        """The request head sent upstream, with ingress-nginx's proxy headers."""
        lines = [head.method + b" " + head.url + b" HTTP/1.1"]
        request_id = next((v for k, v in head.headers if k.lower() == b"x-request-id" and v), None)
        xff = [v for k, v in head.headers if k.lower() == b"x-forwarded-for"]
        upgrade = (next((v for k, v in head.headers if k.lower() == b"upgrade"), None)
                   if head.upgrade else None)
        hostb = host.encode("latin-1") if host else f"{local[0]}".encode()
        remote = peer[0].encode()
        lines += [b"Host: " + hostb, b"X-Request-ID: " + (request_id or secrets.token_hex(16).encode()),
                  b"X-Real-IP: " + remote, b"X-Forwarded-For: " + remote, b"X-Forwarded-Host: " + hostb,
                  b"X-Forwarded-Port: " + str(local[1]).encode(), b"X-Forwarded-Proto: http",
                  b"X-Forwarded-Scheme: http", b"X-Scheme: http"]
        if xff:
            lines.append(b"X-Original-Forwarded-For: " + b", ".join(xff))
        if upgrade is not None:
            lines += [b"Connection: upgrade", b"Upgrade: " + upgrade]
        lines += [k + b": " + v for k, v in head.headers if k.lower() not in _HOP]
        if head.chunked:
            lines.append(b"Transfer-Encoding: chunked")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _exchange(self, head: Head, requests: MessageReader, writer: asyncio.StreamWriter,
                        conn: Conn, node: str, out: bytes,
                        set_cookies: tuple[str, ...], client_keep: bool) -> bool:
        up_reader, up_writer = conn
        try:
            up_writer.write(out)
            if not head.upgrade:
                while True:
                    ev = await requests.next()
                    if ev is None:
                        raise _UpstreamFailed  # the client went away mid-body
                    if isinstance(ev, End):
                        break
                    assert isinstance(ev, Body)
                    up_writer.write(ok_chunk(ev.data) if head.chunked else ev.data)
                    await up_writer.drain()
                if head.chunked:
                    up_writer.write(b"0\r\n\r\n")
            await up_writer.drain()
        except (ConnectionError, OSError) as err:
            raise _UpstreamFailed from err
        responses = MessageReader(up_reader, response=True)
        try:
            async with asyncio.timeout(self.options.read_timeout_s):  # no task per read, unlike wait_for
                ev = await responses.next()
        except (TimeoutError, ConnectionError, OSError) as err:
            raise _UpstreamFailed from err
        except Exception as err:  # httptools.HttpParserError: a malformed response
            raise _UpstreamFailed from err
        if not isinstance(ev, Head):
            raise _UpstreamFailed
        resp = ev
        no_body = head.method == b"HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        chunk_out = (not no_body and resp.content_length is None and head.version == "1.1")
        framed = resp.content_length is not None or resp.chunked or no_body
        keep = client_keep and resp.keep_alive and framed
        lines = [f"HTTP/1.1 {resp.status} ".encode() + _reason(resp.status)]
        lines += [k + b": " + v for k, v in resp.headers if k.lower() not in _RESPONSE_HOP]
        lines += [b"Set-Cookie: " + c.encode("latin-1") for c in set_cookies]
        if chunk_out:
            lines.append(b"Transfer-Encoding: chunked")
        if resp.upgrade:
            lines.append(b"Connection: upgrade")
        else:
            lines.append(b"Connection: keep-alive" if keep else b"Connection: close")
        pending = b"\r\n".join(lines) + b"\r\n\r\n"  # sent with the first body piece: one write, not two
        if resp.upgrade or no_body:
            writer.write(pending)
        if resp.upgrade:
            await self._splice(requests, writer, responses, up_reader, up_writer)
            return False
        if no_body:
            await writer.drain()
            if resp.keep_alive:
                self._pool.put(node, conn)
            else:
                self._pool.discard(conn)
            return keep
        complete = False
        while True:
            try:
                if responses.ready:  # parsed already: no read, so no timer (most small responses)
                    ev = await responses.next()
                else:
                    async with asyncio.timeout(self.options.read_timeout_s):
                        ev = await responses.next()
            except Exception:
                break
            if ev is None:
                break
            if isinstance(ev, End):
                complete = True
                break
            if isinstance(ev, Body):
                writer.write(pending + (ok_chunk(ev.data) if chunk_out else ev.data))
                pending = b""
                await writer.drain()
        if not complete:
            if pending:
                writer.write(pending)
            self._pool.discard(conn)
            return False  # the upstream broke mid-response: cut the client too, as nginx does
        writer.write(pending + b"0\r\n\r\n" if chunk_out else pending)
        await writer.drain()
        if resp.keep_alive:
            self._pool.put(node, conn)
        else:
            self._pool.discard(conn)
        return keep

    async def _splice(self, requests: MessageReader, writer: asyncio.StreamWriter, responses: MessageReader,
                      up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
        await writer.drain()
        if responses.tail:
            writer.write(responses.tail)
        if requests.tail:
            up_writer.write(requests.tail)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(READ_SIZE):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.write_eof()

        client_reader = requests._reader
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(pump(client_reader, up_writer))
                tg.create_task(pump(up_reader, writer))
        finally:
            up_writer.close()


_STATUS_REASONS = {100: b"Continue", 101: b"Switching Protocols", 200: b"OK", 201: b"Created",
                   204: b"No Content", 301: b"Moved Permanently", 302: b"Found", 304: b"Not Modified",
                   400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
                   500: b"Internal Server Error", 502: b"Bad Gateway", 503: b"Service Unavailable"}


def _host_name(host: str) -> str:
    """``$host``: the Host header in lower case without its port."""
    h = host.strip().lower()
    if h.startswith("["):
        return h.split("]", 1)[0] + "]"
    return h.split(":", 1)[0] if h.count(":") == 1 else h


def _reason(status: int) -> bytes:
    return _STATUS_REASONS.get(status, b"Unknown")
