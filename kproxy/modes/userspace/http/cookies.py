"""Cookies as ingress-nginx reads and writes them: lua-resty-cookie, nginx ``cookie_time``.

* :func:`parse_cookie_header` is lua-resty-cookie's ``get_cookie_table``
  (cloudflare/lua-resty-cookie ``lib/resty/cookie.lua``): ``name=value`` pairs split on ``;``,
  leading blanks skipped, a value ending at ``;``, a tab, or a space that follows a ``;``; the
  last duplicate wins; no unquoting.
* :func:`bake_set_cookie` is lua-resty-cookie's ``bake``: ``key=value`` then ``Expires``,
  ``Max-Age``, ``Domain``, ``Path``, ``Secure``, ``HttpOnly``, ``SameSite``, in that order, and a
  ``SameSite`` other than exactly ``Strict``, ``Lax`` or ``None`` dropped (with a warning there).
* :func:`cookie_time` is nginx's ``ngx_http_cookie_time`` (``src/core/ngx_times.c``):
  ``Sun, 12-Feb-17 14:11:12 GMT``, a two-digit year up to 2037 and four digits after.
* :func:`same_site_none_compatible` is ingress-nginx's ``util/same_site.lua``: the user agents
  that reject ``SameSite=None`` cookies (chromium.org "incompatible clients").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = [
    "SAMESITE_VALUES",
    "SetCookie",
    "bake_set_cookie",
    "cookie_time",
    "parse_cookie_header",
    "same_site_none_compatible",
]

#: The only ``SameSite`` values lua-resty-cookie's ``bake`` keeps (compared case-sensitively).
SAMESITE_VALUES = frozenset({"Strict", "Lax", "None"})

_WEEK = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def cookie_time(epoch_s: int) -> str:
    """Format ``epoch_s`` (whole seconds since the epoch, UTC) as nginx's ``cookie_time``.

    >>> cookie_time(1486908672)
    'Sun, 12-Feb-17 14:11:12 GMT'
    """
    tm = time.gmtime(epoch_s)
    year = tm.tm_year if tm.tm_year > 2037 else tm.tm_year % 100
    return (f"{_WEEK[tm.tm_wday]}, {tm.tm_mday:02d}-{_MONTHS[tm.tm_mon - 1]}-{year:02d} "
            f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} GMT")


def parse_cookie_header(text: str) -> dict[str, str]:
    """Split a ``Cookie`` request header into ``{name: value}`` as lua-resty-cookie does.

    lua-resty-cookie's state machine, written with ``str.find``: blanks before a name are
    skipped; the name runs to the next ``=`` (whatever it holds, ``;`` included); the value runs
    to the next ``;`` or tab (a space never ends it: the machine ends a value at a space only
    right after a ``;``, which has already ended it); a last name without ``=`` is dropped, a
    last value without ``;`` kept; the last duplicate wins; no unquoting. Several ``Cookie``
    headers are joined with ``"; "`` first by the caller (nginx's ``$http_cookie`` does the
    same). ``tests/unit/http/test_cookies.py`` checks it against the state machine itself.
    """
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t":
            i += 1
        eq = text.find("=", i)
        if i >= n or eq < 0:
            break
        start = eq + 1
        semi, tab = text.find(";", start), text.find("\t", start)
        end = min(semi, tab) if semi >= 0 and tab >= 0 else max(semi, tab)
        if end < 0:
            out[text[i:eq]] = text[start:]
            break
        out[text[i:eq]] = text[start:end]
        i = end + 1
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SetCookie:
    """The fields lua-resty-cookie's ``bake`` reads; None (or False) leaves an attribute out.

    Attributes:
        name, value: the cookie.
        expires: a formatted date (see :func:`cookie_time`).
        max_age: seconds.
        domain, path: the scope.
        secure, httponly: the flags.
        samesite: ``Strict``, ``Lax`` or ``None``; any other text is dropped when baked.
    """

    name: str
    value: str
    expires: str | None = None
    max_age: int | None = None
    domain: str | None = None
    path: str | None = None
    secure: bool = False
    httponly: bool = False
    samesite: str | None = None


def bake_set_cookie(cookie: SetCookie) -> str:
    """Return the ``Set-Cookie`` header value for ``cookie``, attribute order as lua-resty-cookie."""
    parts = [f"{cookie.name}={cookie.value}"]
    if cookie.expires is not None:
        parts.append(f"Expires={cookie.expires}")
    if cookie.max_age is not None:
        parts.append(f"Max-Age={cookie.max_age}")
    if cookie.domain is not None:
        parts.append(f"Domain={cookie.domain}")
    if cookie.path is not None:
        parts.append(f"Path={cookie.path}")
    if cookie.secure:
        parts.append("Secure")
    if cookie.httponly:
        parts.append("HttpOnly")
    if cookie.samesite is not None and cookie.samesite in SAMESITE_VALUES:
        parts.append(f"SameSite={cookie.samesite}")
    return "; ".join(parts)


def same_site_none_compatible(user_agent: str) -> bool:
    """Whether a browser with ``user_agent`` accepts ``SameSite=None`` (ingress-nginx ``same_site.lua``)."""
    if any(s in user_agent for s in ("Chrome/4", "Chrome/5", "Chrome/6", "CPU iPhone OS 12",
                                      "iPad; CPU OS 12")):
        return False
    return not ("Macintosh" in user_agent and "Intel Mac OS X 10_14" in user_agent
                and "Safari" in user_agent and "Chrome" not in user_agent)
