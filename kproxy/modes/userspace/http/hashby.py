"""``upstream-hash-by``: ingress-nginx's ``balancer/chash.lua`` over nginx variables.

The annotation's text is split as ``util.parse_complex_value`` does (``\\$var`` stays literal
text, ``${var}`` and ``$var`` are variables, anything else is literal), the variables are
replaced by the request's values (``util.generate_var_value``; an unknown or empty variable adds
nothing) and the resulting key goes through the same
:class:`~kproxy.modes.userspace.http.chash.RestyChash` ring as balanced cookie affinity.

Variables known here: ``request_uri``, ``uri``, ``args``, ``remote_addr``, ``host``, ``scheme``,
``request_method``, ``http_NAME`` (header ``NAME`` with ``-`` as ``_``, case-insensitive),
``cookie_NAME`` and ``arg_NAME``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

from kproxy.modes.userspace.http.chash import RestyChash
from kproxy.modes.userspace.http.cookies import parse_cookie_header

__all__ = ["HashByRequest", "HashByTemplate", "parse_complex_value"]

_COMPLEX_RE = re.compile(r"(\\\$[0-9a-zA-Z_]+)|\$\{([0-9a-zA-Z_]+)\}|\$([0-9a-zA-Z_]+)|(\$|[^$\\]+)",
                         re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class HashByRequest:
    """The request facts nginx variables are read from.

    Attributes:
        request_uri: the request target as sent (path and query).
        remote_addr: the client address without port.
        host: ``$host``; scheme ``http`` or ``https``; method the request method.
        headers: ``(name, value)`` pairs as received.
    """

    request_uri: str
    remote_addr: str
    host: str = ""
    scheme: str = "http"
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()

    def variable(self, name: str) -> str | None:
        """The value of nginx variable ``$name``, or None when unset."""
        lower = name.lower()
        path, _, query = self.request_uri.partition("?")
        simple = {"request_uri": self.request_uri, "uri": path, "args": query,
                  "remote_addr": self.remote_addr, "host": self.host, "scheme": self.scheme,
                  "request_method": self.method}
        if lower in simple:
            return simple[lower] or None
        if lower.startswith("http_"):
            wanted = lower[5:]
            values = [v for k, v in self.headers if k.lower().replace("-", "_") == wanted]
            return ", ".join(values) if values else None
        if lower.startswith("cookie_"):
            joined = "; ".join(v for k, v in self.headers if k.lower() == "cookie")
            return parse_cookie_header(joined).get(name[7:]) if joined else None
        if lower.startswith("arg_"):
            for k, v in parse_qsl(query, keep_blank_values=True):
                if k.lower() == lower[4:]:
                    return v
        return None


def parse_complex_value(text: str) -> tuple[tuple[str, bool], ...]:
    """Split ``text`` into ``(piece, is_variable)`` as ``util.parse_complex_value``."""
    out: list[tuple[str, bool]] = []
    for m in _COMPLEX_RE.finditer(text):
        escaped, braced, bare, literal = m.groups()
        if braced or bare:
            out.append((braced or bare, True))
        else:
            out.append((escaped or literal, False))
    return tuple(out)


class HashByTemplate:
    """One backend's ``upstream-hash-by`` balancer: the template and the chash ring.

    Args:
        template: the annotation's text, e.g. ``$request_uri`` or ``$http_x_user$remote_addr``.
        nodes: the ``address:port`` node ids.

    Raises:
        InvalidArgument: no node (from :class:`RestyChash`).
    """

    __slots__ = ("_chash", "_pieces", "template")

    def __init__(self, template: str, nodes: Mapping[str, int] | list[str] | tuple[str, ...]) -> None:
        self.template = template
        self._pieces = parse_complex_value(template)
        weights = dict(nodes) if isinstance(nodes, Mapping) else {n: 1 for n in nodes}
        self._chash = RestyChash(weights)

    def key(self, request: HashByRequest) -> str:
        """``generate_var_value``: the template with the request's variables filled in."""
        parts: list[str] = []
        for piece, is_var in self._pieces:
            if is_var:
                value = request.variable(piece)
                if value is not None:
                    parts.append(value)
            else:
                parts.append(piece)
        return "".join(parts)

    def find(self, request: HashByRequest) -> str:
        """The node for ``request``."""
        return self._chash.find(self.key(request))
