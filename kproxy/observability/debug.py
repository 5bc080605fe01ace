"""``/debug/rules`` and ``/debug/trace`` on the metrics server: inspecting a running emulated node.

kube-proxy has no such endpoints: on a real node one reads ``iptables-save`` and the kernel's
own tools. A ``--kernel emulated`` run has no kernel to ask, so its metrics server (loopback by
default, like ``/metrics``) answers for it:

* ``GET /debug/rules[?family=IPv4|IPv6][&dump=iptables-save|ipvsadm-save|ipset-save|nft-ruleset]``: the
  rules the running modes programmed, in the kernel tools' own formats, so that the text can be
  given back to ``kproxy trace --iptables-save FILE``, ``--ipvs-dump FILE`` or
  ``--nft-ruleset FILE``. Without ``dump`` every dump of every family is printed, each section
  headed by a ``#`` comment line.
* ``GET /debug/trace?src=IP[:PORT]&dst=IP:PORT[&proto=tcp|udp|sctp][&connections=N][&format=text]``:
  where that packet goes through the live node, as ``kproxy trace --json`` prints it (or its
  text report). ``kproxy trace --from-run URL`` asks this.

A run that has nothing to show (userspace mode, ``--kernel linux``) answers 404 with a line
saying where to look instead. Bad parameters answer 400 with the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from aiohttp import web

from kproxy.errors import ConfigError

__all__ = ["DebugEndpoints", "add_debug_routes"]

_NOT_HERE = ("the debug endpoints inspect a `kproxy run --kernel emulated` kernel mode; this run has "
             "no emulated node ({why}). On a real node read iptables-save, ipvsadm-save -n or nft list "
             "ruleset and give it to kproxy trace --iptables-save, --ipvs-dump or --nft-ruleset FILE.\n")


@runtime_checkable
class DebugEndpoints(Protocol):
    """What a running mode offers ``/debug/rules`` and ``/debug/trace`` (see the module docstring)."""

    def rules(self, params: Mapping[str, str]) -> str:
        """The programmed rules as text, filtered by ``family`` and ``dump``.

        Raises:
            ConfigError: an unknown family or dump name.
        """
        ...

    def trace(self, params: Mapping[str, str]) -> tuple[str, str]:
        """Trace the packet ``params`` describe; returns ``(content_type, body)``.

        Raises:
            ConfigError: a missing or malformed parameter.
        """
        ...


def add_debug_routes(app: web.Application, debug: DebugEndpoints | None, *, why_not: str) -> None:
    """Add ``/debug/rules`` and ``/debug/trace`` to ``app``, answered by ``debug``; without one they
    answer 404 and say ``why_not`` (for example "userspace mode")."""

    async def rules(request: web.Request) -> web.Response:
        if debug is None:
            return web.Response(status=404, text=_NOT_HERE.format(why=why_not))
        try:
            return web.Response(text=debug.rules(request.query))
        except ConfigError as err:
            return web.Response(status=400, text=f"{err}\n")

    async def trace(request: web.Request) -> web.Response:
        if debug is None:
            return web.Response(status=404, text=_NOT_HERE.format(why=why_not))
        try:
            content_type, body = debug.trace(request.query)
        except ConfigError as err:
            return web.Response(status=400, text=f"{err}\n")
        return web.Response(text=body, content_type=content_type)

    app.router.add_get("/debug/rules", rules)
    app.router.add_get("/debug/trace", trace)
