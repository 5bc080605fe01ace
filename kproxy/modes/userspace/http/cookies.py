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

    Several ``Cookie`` headers are joined with ``"; "`` first by the caller (nginx's
    ``$http_cookie`` does the same). A name without ``=`` at the end of the text is dropped; a
    trailing ``name=value`` without ``;`` is kept.
    """
    out: dict[str, str] = {}
    expect_key, expect_value, expect_sp = 1, 2, 3
    state = expect_sp
    i = j = 0
    n = len(text)
    key: str | None = None
    value: str | None = None
    while j < n:
        c = text[j]
        if state == expect_key:
            if c == "=":
                key = text[i:j]
                state = expect_value
                i = j + 1
        elif state == expect_value:
            if c in ";\t" or (c == " " and j > 0 and text[j - 1] == ";"):
                value = text[i:j]
                assert key is not None
                out[key] = value
                key = value = None
                state = expect_sp
                i = j + 1
        elif c not in " \t":  # expect_sp
            state = expect_key
            i = j
            j -= 1
        j += 1
    if key is not None and value is None:
        out[key] = text[i:]
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
