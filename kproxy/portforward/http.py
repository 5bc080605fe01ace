"""The client's HTTP/1.1 to the API server: kubeconfig, GET as JSON, and the two upgrades.

Theory of operation
-------------------
:func:`load_kubeconfig` reads the current context's server, bearer token and TLS material (CA,
client certificate, ``insecure-skip-tls-verify``) into an :class:`ApiEndpoint`. Every request
opens its own connection (h11 frames it); the port-forward upgrades keep theirs:
:func:`upgrade_spdy` POSTs with ``Upgrade: SPDY/3.1`` and ``X-Stream-Protocol-Version:
portforward.k8s.io`` (client-go ``transport/spdy``), :func:`upgrade_tunnel` GETs a WebSocket with
the subprotocol ``SPDY/3.1+portforward.k8s.io`` (client-go ``tools/portforward/tunneling_dialer.go``).
A response other than 101 is :class:`UpgradeFailed`, on which the caller falls back to SPDY, as
client-go's ``fallback_dialer.go`` does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h11
import yaml

from kproxy.errors import ConfigError, PortForwardError, UpgradeFailed
from kproxy.portforward.connection import READ_CHUNK, ByteChannel, StreamChannel
from kproxy.portforward.protocol import PROTOCOL_V1, TUNNEL_PROTOCOL
from kproxy.portforward.websocket import WebSocketChannel, accept_token, client_handshake_headers

__all__ = ["ApiEndpoint", "UpgradeFailed", "get_json", "load_kubeconfig", "upgrade_spdy", "upgrade_tunnel"]

CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiEndpoint:
    """Where the API server is and how to authenticate: ``server`` is ``http(s)://host:port``."""

    server: str
    token: str | None = None
    namespace: str = "default"
    ssl_context: ssl.SSLContext | None = None

    @property
    def host(self) -> str:
        """The server's host name or address."""
        return urlsplit(self.server).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        """The server's port (443 or 80 by scheme when absent)."""
        parts = urlsplit(self.server)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def prefix(self) -> str:
        """The server URL's path prefix (usually empty)."""
        return urlsplit(self.server).path.rstrip("/")

    def headers(self) -> list[tuple[str, str]]:
        """Host, User-Agent and Authorization headers for a request."""
        out = [("Host", f"{self.host}:{self.port}"), ("User-Agent", "kproxy")]
        if self.token:
            out.append(("Authorization", f"Bearer {self.token}"))
        return out


def _material(entry: Mapping[str, Any], key: str, base: Path) -> str | None:
    data = entry.get(f"{key}-data")
    if data:
        handle, name = tempfile.mkstemp(prefix="kproxy-kubeconfig-")
        with os.fdopen(handle, "wb") as f:
            f.write(base64.b64decode(data))
        return name
    path = entry.get(key)
    return str(base / path) if path else None


def _named(entries: Any, name: Any, key: str) -> dict[str, Any] | None:
    for entry in entries or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            value = entry.get(key)
            return dict(value) if isinstance(value, Mapping) else {}
    return None


def load_kubeconfig(path: str | Path | None = None, *, context: str | None = None) -> ApiEndpoint:
    """The API endpoint of ``path``'s current (or named) context; ``path`` defaults to
    ``$KUBECONFIG`` then ``~/.kube/config``.

    Raises:
        ConfigError: the file is missing or unreadable, or the context, cluster or server is missing.
    """
    file = Path(path or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or Path.home() / ".kube/config")
    try:
        doc = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--kubeconfig {file}: cannot read it: {err}") from err
    name = context or doc.get("current-context")
    ctx = next((c.get("context", {}) for c in doc.get("contexts") or [] if c.get("name") == name), None)
    if ctx is None:
        raise ConfigError(f"--kubeconfig {file}: context {name!r} not found")
    cluster = _named(doc.get("clusters"), ctx.get("cluster"), "cluster")
    if not cluster or not cluster.get("server"):
        raise ConfigError(f"--kubeconfig {file}: cluster {ctx.get('cluster')!r} has no server")
    user = _named(doc.get("users"), ctx.get("user"), "user") or {}
    server = str(cluster["server"])
    context_ssl = None
    if server.startswith("https://"):
        ca = _material(cluster, "certificate-authority", file.parent)
        context_ssl = ssl.create_default_context(cafile=ca)
        if cluster.get("insecure-skip-tls-verify"):
            context_ssl.check_hostname = False
            context_ssl.verify_mode = ssl.CERT_NONE
        cert = _material(user, "client-certificate", file.parent)
        if cert:
            context_ssl.load_cert_chain(cert, _material(user, "client-key", file.parent))
    return ApiEndpoint(server=server, token=user.get("token"), namespace=ctx.get("namespace") or "default",
                       ssl_context=context_ssl)


async def _open(endpoint: ApiEndpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.wait_for(asyncio.open_connection(
            endpoint.host, endpoint.port, ssl=endpoint.ssl_context, limit=READ_CHUNK), CONNECT_TIMEOUT_S)
    except (TimeoutError, OSError) as err:
        raise PortForwardError(f"cannot reach the API server {endpoint.server}: {err}") from err


async def _response(conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[int, bytes, dict[str, str]]:
    status, body, headers = 0, bytearray(), {}
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
            continue
        if isinstance(event, h11.InformationalResponse | h11.Response):
            status = event.status_code
            headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            if status == 101:
                return status, b"", headers
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return status, bytes(body), headers


async def get_json(endpoint: ApiEndpoint, path: str) -> tuple[int, Any]:
    """GET ``path`` (with query) and decode the JSON body; returns ``(status, document)``.

    Raises:
        PortForwardError: the server cannot be reached or the answer is not JSON.
    """
    reader, writer = await _open(endpoint)
    try:
        conn = h11.Connection(h11.CLIENT)
        headers = [*endpoint.headers(), ("Accept", "application/json"), ("Connection", "close")]
        request = h11.Request(method="GET", target=endpoint.prefix + path, headers=headers)
        writer.write(conn.send(request) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        status, body, _ = await _response(conn, reader)
    except (h11.ProtocolError, ConnectionError, OSError) as err:
        raise PortForwardError(f"GET {path}: {err}") from err
    finally:
        writer.close()
    try:
        return status, json.loads(body or b"{}")
    except ValueError as err:
        raise PortForwardError(f"GET {path}: HTTP {status} with a body that is not JSON") from err


async def _upgrade(endpoint: ApiEndpoint, method: str, path: str,
                   headers: list[tuple[str, str]]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                                            dict[str, str], bytes]:
    reader, writer = await _open(endpoint)
    try:
        conn = h11.Connection(h11.CLIENT)
        request = h11.Request(method=method, target=endpoint.prefix + path,
                              headers=[*endpoint.headers(), *headers, ("Content-Length", "0")])
        writer.write(conn.send(request) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        status, body, got = await _response(conn, reader)
        if status != 101:
            raise UpgradeFailed(status, body.decode("utf-8", "replace"))
        return reader, writer, got, conn.trailing_data[0]
    except UpgradeFailed:
        writer.close()
        raise
    except (h11.ProtocolError, ConnectionError, OSError) as err:
        writer.close()
        raise PortForwardError(f"upgrade of {path}: {err}") from err
    except BaseException:
        writer.close()
        raise


async def upgrade_spdy(endpoint: ApiEndpoint, path: str) -> ByteChannel:
    """The SPDY/3.1 upgrade of ``path`` (``.../pods/NAME/portforward``); returns the channel.

    Raises:
        UpgradeFailed: the server did not switch protocols.
        PortForwardError: the server is unreachable, or negotiated another stream protocol.
    """
    reader, writer, headers, rest = await _upgrade(endpoint, "POST", path, [
        ("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"), ("X-Stream-Protocol-Version", PROTOCOL_V1)])
    if headers.get("x-stream-protocol-version", PROTOCOL_V1) != PROTOCOL_V1:
        writer.close()
        raise PortForwardError("unable to negotiate protocol: client supports "
                               f"[{PROTOCOL_V1}], server returned {headers.get('x-stream-protocol-version')}")
    return StreamChannel(reader, writer, initial=rest)


async def upgrade_tunnel(endpoint: ApiEndpoint, path: str) -> ByteChannel:
    """The WebSocket upgrade of ``path`` tunnelling SPDY (KEP-4006); returns the channel.

    Raises:
        UpgradeFailed: the server did not switch protocols (fall back to :func:`upgrade_spdy`).
        PortForwardError: a bad handshake answer.
    """
    key, ws_headers = client_handshake_headers((TUNNEL_PROTOCOL,))
    reader, writer, headers, rest = await _upgrade(endpoint, "GET", path, ws_headers)
    if headers.get("sec-websocket-accept") != accept_token(key):
        writer.close()
        raise PortForwardError("WebSocket handshake: wrong Sec-WebSocket-Accept")
    if headers.get("sec-websocket-protocol") != TUNNEL_PROTOCOL:
        writer.close()
        got = headers.get("sec-websocket-protocol")
        raise UpgradeFailed(101, f"subprotocol {got!r} is not {TUNNEL_PROTOCOL}")
    return WebSocketChannel(reader, writer, client=True, initial=rest)
