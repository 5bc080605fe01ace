"""Small aiohttp helpers: bind addresses as kube-proxy writes them, and a serving context."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import AsyncIterator

from aiohttp import web

from kproxy.errors import ConfigError

__all__ = ["BindAddress", "parse_bind_address", "serving"]

BindAddress = tuple[str, int]


def parse_bind_address(text: str, *, default_port: int, flag: str) -> BindAddress | None:
    """Parse ``IP:PORT``, ``[IPv6]:PORT`` or a bare ``IP`` (kube-proxy appends the default port).

    Args:
        text: the flag's value; ``""`` disables the server (returns None), as in kube-proxy.
        default_port: the port used when none is given.
        flag: the flag name, for messages.

    Returns:
        ``(host, port)``; port 0 asks the OS for a free port.

    Raises:
        ConfigError: not an IP address with an optional port in 0..65535.
    """
    raw = text.strip()
    if not raw:
        return None
    host, port = raw, default_port
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            raise ConfigError(f"{flag}: {text!r} has '[' without ']'; expected [IPv6]:PORT")
        host, rest = raw[1:end], raw[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"{flag}: {text!r}: expected ':' after ']'")
            port = _port(rest[1:], text, flag)
    elif raw.count(":") == 1:
        host, _, port_text = raw.partition(":")
        port = _port(port_text, text, flag)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{flag}: {host!r} in {text!r} is not an IP address; expected IP:PORT") from None
    return host, port


def _port(text: str, whole: str, flag: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ConfigError(f"{flag}: port {text!r} in {whole!r} is not a number in 0..65535")
    return int(text)


@contextlib.asynccontextmanager
async def serving(app: web.Application, address: BindAddress, *, what: str) -> AsyncIterator[BindAddress]:
    """Serve ``app`` on ``address`` while the context is open; yields the bound ``(host, port)``.

    Raises:
        ConfigError: the address cannot be bound (in use, not local); the message names ``what``.
    """
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, address[0], address[1], reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            raise ConfigError(f"{what}: cannot listen on {address[0]}:{address[1]}: {err.strerror or err}; "
                              "choose another address or port") from err
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[:2] if sockets else address
        yield str(bound[0]), int(bound[1])
    finally:
        await runner.cleanup()
