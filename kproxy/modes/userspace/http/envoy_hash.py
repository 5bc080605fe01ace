"""Envoy's request hash (``source/common/http/hash_policy.cc``) and its generated cookie.

Theory of operation:

* Each policy gives a 64-bit XXH64 (seed 0) or nothing: ``header`` hashes the request's values
  of that header, sorted, as one stream (``HashUtil::xxHash64`` over a span is a streaming hash
  of the concatenation); ``cookie`` hashes the cookie's value (Envoy's ``parseCookieValue``: the
  first cookie of that name, surrounding double quotes stripped); ``source_ip`` hashes the
  client address without port (``addressAsString``); ``query_parameter`` hashes the first raw
  value of the parameter (``QueryParamsMulti::getFirstValue``, not URL-decoded).
* Several policies combine as ``hash = rotl64(hash, 1) ^ new`` (the first one is XORed into 0);
  a ``terminal`` policy stops the evaluation once a hash exists.
* A cookie policy with a ``ttl`` and no such cookie in the request *generates* one
  (``Router::Filter::addDownstreamSetCookie``): the value is ``Hex::uint64ToHex`` of XXH64 of the
  downstream connection's remote then local address (``ip:port`` each, IPv6 bracketed), the
  request is hashed with it, and the response carries ``name="value"`` with ``Max-Age`` (unless
  the ttl is 0: a session cookie), ``Path`` (when set) and ``HttpOnly``
  (``Http::Utility::makeSetCookieValue``).
* No hash at all: the load balancer uses a random 64-bit value instead (Envoy's
  ``ThreadAwareLoadBalancerBase`` ``chooseHost``), so consistent hashing turns random.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import xxhash

from kproxy.modes.userspace.http.chash import wire_bytes

__all__ = [
    "HashPolicy",
    "HashPolicyKind",
    "HashRequest",
    "HashResult",
    "envoy_cookie_value",
    "generated_cookie_value",
    "make_set_cookie_value",
    "request_hash",
    "rotl64",
    "xxh64",
]

_MASK64 = (1 << 64) - 1


def xxh64(data: str | bytes, seed: int = 0) -> int:
    """``HashUtil::xxHash64``: the XXH64 of ``data`` (text as its wire bytes) as an unsigned 64-bit int."""
    return xxhash.xxh64_intdigest(wire_bytes(data), seed)


def rotl64(value: int, bits: int = 1) -> int:
    """Rotate a 64-bit value left by ``bits``."""
    return ((value << bits) | (value >> (64 - bits))) & _MASK64


class HashPolicyKind(StrEnum):
    """The route hash policies Istio's ``consistentHash`` produces."""

    HEADER = "header"
    COOKIE = "cookie"
    SOURCE_IP = "source_ip"
    QUERY_PARAMETER = "query_parameter"


@dataclass(frozen=True, slots=True, kw_only=True)
class HashPolicy:
    """One ``RouteAction.HashPolicy``.

    Attributes:
        kind: which value is hashed.
        name: the header name (any case), cookie name or query parameter name; ``""`` for
            ``source_ip``.
        path: the generated cookie's Path (``""``: none).
        ttl_s: the generated cookie's lifetime in whole seconds; None means "never generate".
        terminal: stop at this policy once a hash exists.
    """

    kind: HashPolicyKind
    name: str = ""
    path: str = ""
    ttl_s: int | None = None
    terminal: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class HashRequest:
    """What the policies read from one request.

    Attributes:
        headers: ``(name, value)`` pairs as received.
        path: the ``:path`` (request target with query).
        remote: the downstream client ``(ip, port)``; local: the listener ``(ip, port)`` that
            accepted it.
    """

    headers: tuple[tuple[str, str], ...]
    path: str
    remote: tuple[str, int]
    local: tuple[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class HashResult:
    """The request hash and the cookies Envoy would add to the response.

    Attributes:
        hash: the 64-bit hash, or None (then the balancer draws a random value).
        set_cookies: ``Set-Cookie`` values of generated cookies, in policy order.
    """

    hash: int | None
    set_cookies: tuple[str, ...] = ()


def _address_as_string(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def generated_cookie_value(remote: tuple[str, int], local: tuple[str, int]) -> str:
    """The value Envoy generates: 16 lowercase hex digits of XXH64(remote + local ``ip:port``)."""
    return f"{xxh64(_address_as_string(*remote) + _address_as_string(*local)):016x}"


def make_set_cookie_value(name: str, value: str, path: str, max_age_s: int) -> str:
    """``Http::Utility::makeSetCookieValue`` with HttpOnly.

    ``name="value"``, then ``; Max-Age=N`` unless 0, ``; Path=P`` when set, and ``; HttpOnly``.
    """
    out = f'{name}="{value}"'
    if max_age_s != 0:
        out += f"; Max-Age={max_age_s}"
    if path:
        out += f"; Path={path}"
    return out + "; HttpOnly"


def envoy_cookie_value(headers: Sequence[tuple[str, str]], name: str) -> str:
    """Envoy's ``parseCookieValue``: the first ``name`` cookie of the ``Cookie`` headers, or ``""``."""
    for key, value in headers:
        if key.lower() != "cookie":
            continue
        for piece in value.split(";"):
            piece = piece.lstrip(" ")
            k, eq, v = piece.partition("=")
            if not eq or k != name:
                continue
            if len(v) >= 2 and v[0] == '"' and v[-1] == '"':
                v = v[1:-1]
            return v
    return ""


def _first_query_value(path: str, name: str) -> str | None:
    _, sep, query = path.partition("?")
    if not sep:
        return None
    query = query.split("#", 1)[0]
    for piece in query.split("&"):
        if not piece:
            continue
        k, _, v = piece.partition("=")
        if k == name:
            return v
    return None


def _evaluate(policy: HashPolicy, request: HashRequest, cookies: list[str]) -> int | None:
    if policy.kind is HashPolicyKind.HEADER:
        wanted = policy.name.lower()
        values = sorted(v for k, v in request.headers if k.lower() == wanted)
        return xxh64("".join(values)) if values else None
    if policy.kind is HashPolicyKind.COOKIE:
        value = envoy_cookie_value(request.headers, policy.name)
        if not value and policy.ttl_s is not None:
            value = generated_cookie_value(request.remote, request.local)
            cookies.append(make_set_cookie_value(policy.name, value, policy.path, policy.ttl_s))
        return xxh64(value) if value else None
    if policy.kind is HashPolicyKind.SOURCE_IP:
        return xxh64(request.remote[0]) if request.remote[0] else None
    query_value = _first_query_value(request.path, policy.name)
    return xxh64(query_value) if query_value is not None else None


def request_hash(policies: Sequence[HashPolicy], request: HashRequest) -> HashResult:
    """``HashPolicyImpl::generateHash`` over ``policies`` for ``request``."""
    result: int | None = None
    cookies: list[str] = []
    for policy in policies:
        new = _evaluate(policy, request, cookies)
        if new is not None:
            result = (rotl64(result) if result is not None else 0) ^ new
        if policy.terminal and result is not None:
            break
    return HashResult(hash=result, set_cookies=tuple(cookies))
