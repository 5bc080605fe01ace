"""ingress-nginx cookie affinity: the sticky balancers and their ``balance()``, byte for byte.

Theory of operation (kubernetes/ingress-nginx ``rootfs/etc/nginx/lua/balancer/sticky.lua``,
``sticky_balanced.lua``, ``sticky_persistent.lua``, ``util/nodemap.lua``):

* A backend (upstream) is named ``namespace-service-port`` (the controller's ``upstreamName``)
  and its nodes are ``"<address>:<port>"``, weight 1 (``util.get_nodes``). ``backend_key`` is
  ``md5_hex(md5_hex(name) .. name)``.
* The cookie value is ``upstream_key .. "|" .. backend_key``. Reading it, the text is split on
  ``|``: the first part is the key, the second (optional: cookies from before #7371 have none)
  the backend key.
* ``balanced`` mode: the key is random text, ``"<ngx.now()+i>.<worker pid>.<1..999999>"``,
  routed through the :class:`~kproxy.modes.userspace.http.chash.RestyChash` ring, so any key
  (even a tampered one) maps to a node and is never rewritten. ``pick_new_upstream`` tries up to
  20 fresh keys, skipping the peers this request already tried.
* ``persistent`` mode: the key is ``md5_hex(name .. node)``, looked up in an exact map; a key no
  live node has (its pod left, or tampering) finds nothing, so a new node is drawn uniformly at
  random among the untried ones and a new cookie is set.
* ``balance()`` runs once per attempt of a request (``proxy_next_upstream`` retries call it
  again with ``get_last_failure()`` set). It keeps the cookie's node unless it has none, or this
  is a retry and ``change-on-failure`` is on; then it picks a new node and sets the cookie, but
  only when the request's ``(host, location path)`` is one the affinity Ingresses declared.

Randomness and time are arguments: a ``random.Random``, the clock's ``now_s`` and a worker id.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from kproxy.errors import InvalidArgument
from kproxy.modes.userspace.http.annotations import AffinityMode, CookieAffinity
from kproxy.modes.userspace.http.chash import RestyChash, wire_bytes
from kproxy.modes.userspace.http.cookies import (
    SetCookie,
    bake_set_cookie,
    cookie_time,
    parse_cookie_header,
    same_site_none_compatible,
)

__all__ = [
    "MAX_UPSTREAM_CHECKS_COUNT",
    "Balanced",
    "StickyBalancer",
    "backend_key",
    "cookie_value",
    "md5_hex",
    "node_id",
    "parse_cookie_value",
    "set_cookie_header",
    "should_set_cookie",
    "upstream_name",
]

#: ``sticky_balanced.lua``: fresh random keys tried before giving up on a new node.
MAX_UPSTREAM_CHECKS_COUNT = 20
#: ``sticky.lua``'s ``COOKIE_VALUE_DELIMITER``.
COOKIE_VALUE_DELIMITER = "|"


def md5_hex(text: str) -> str:
    """``ngx.md5``: 32 lowercase hex digits of the MD5 of ``text`` (its :func:`wire_bytes`)."""
    return hashlib.md5(wire_bytes(text), usedforsecurity=False).hexdigest()


def upstream_name(namespace: str, service: str, port: int | str) -> str:
    """The ingress-nginx upstream (backend) name: ``namespace-service-port``.

    ``port`` is the Ingress backend's port number, or its name when it names the port (the
    controller's ``upstreamName``).
    """
    return f"{namespace}-{service}-{port}"


def backend_key(name: str) -> str:
    """``md5_hex(md5_hex(name) .. name)``: the cookie's suffix for backend ``name`` (sticky.lua ``sync``)."""
    return md5_hex(md5_hex(name) + name)


def node_id(address: str, port: int) -> str:
    """``util.get_nodes``: ``address .. ":" .. port`` (an IPv6 address stays unbracketed, as there)."""
    return f"{address}:{port}"


def cookie_value(key: str, backend: str) -> str:
    """The value sticky.lua writes: ``key|backend_key(backend)``."""
    return f"{key}{COOKIE_VALUE_DELIMITER}{backend_key(backend)}"


def parse_cookie_value(raw: str | None) -> tuple[str | None, str | None]:
    """Split a cookie value into ``(upstream_key, backend_key)`` as ``get_cookie_parsed``.

    ``util.split.split_string`` drops empty pieces, so ``""`` and ``"|"`` give ``(None, None)``
    and ``"|abc"`` gives ``("abc", None)``.
    """
    if raw is None:
        return None, None
    parts = [p for p in raw.split(COOKIE_VALUE_DELIMITER) if p]
    if not parts:
        return None, None
    return parts[0], (parts[1] if len(parts) > 1 else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Balanced:
    """What one ``balance()`` call decided.

    Attributes:
        node: the chosen ``address:port``, or None when no node could be picked (every untried
            node excluded; the request then fails as nginx's would with no peer).
        new_key: the upstream key of a newly picked node (None when the cookie's node was kept).
        set_cookie: whether the response must carry a new cookie (a new pick on a location of the
            affinity Ingresses).
    """

    node: str | None
    new_key: str | None = None
    set_cookie: bool = False


class StickyBalancer:
    """One backend's sticky balancer, ``sticky_balanced`` or ``sticky_persistent``.

    Immutable after construction; a changed endpoint set builds a new one (``reinit``).

    Args:
        name: the backend name, ``namespace-service-port`` (see :func:`upstream_name`).
        nodes: the ``address:port`` node ids (at least one).
        affinity: the cookie settings from the first affinity Ingress of this backend.

    Raises:
        InvalidArgument: no node.
    """

    __slots__ = ("_chash", "_map", "_nodes", "affinity", "backend_key", "name")

    def __init__(self, *, name: str, nodes: Iterable[str], affinity: CookieAffinity) -> None:
        node_list = sorted(set(nodes))
        if not node_list:
            raise InvalidArgument(f"StickyBalancer {name!r} needs at least one node (ingress-nginx "
                                  "answers 503 for a backend without endpoints)")
        self.name = name
        self.affinity = affinity
        self.backend_key = backend_key(name)
        self._nodes = tuple(node_list)
        self._chash: RestyChash | None = None
        self._map: dict[str, str] = {}
        if affinity.mode is AffinityMode.PERSISTENT:
            self._map = {md5_hex(name + n): n for n in node_list}
        else:
            self._chash = RestyChash({n: 1 for n in node_list})

    @property
    def nodes(self) -> tuple[str, ...]:
        """The node ids, sorted."""
        return self._nodes

    def find(self, key: str) -> str | None:
        """The node for an upstream key: the chash node (balanced) or the exact map hit (persistent)."""
        if self._chash is not None:
            return self._chash.find(key)
        return self._map.get(key)

    def pick_new_upstream(self, failed: Collection[str], *, rng: random.Random, now_s: float,
                          worker_pid: int) -> tuple[str | None, str | None]:
        """A new ``(node, key)`` avoiding ``failed`` nodes, or ``(None, None)``.

        Balanced: up to :data:`MAX_UPSTREAM_CHECKS_COUNT` keys ``f"{now_s + i}.{pid}.{r}"``
        (``%s`` of a Lua number is ``%.14g``). Persistent: ``nodemap.random_except``, uniform
        over the untried nodes (in sorted order here; Lua's is ``pairs()`` order).
        """
        if self._chash is not None:
            for i in range(1, MAX_UPSTREAM_CHECKS_COUNT + 1):
                key = f"{format(now_s + i, '.14g')}.{worker_pid}.{rng.randint(1, 999999)}"
                node = self._chash.find(key)
                if node not in failed:
                    return node, key
            return None, None
        candidates = sorted((k, n) for k, n in self._map.items() if n not in failed)
        if not candidates:
            return None, None
        key, node = candidates[rng.randint(1, len(candidates)) - 1]
        return node, key

    def balance(self, *, cookie: str | None, last_failed: bool, tried: Collection[str],
                location_declared: bool, rng: random.Random, now_s: float, worker_pid: int) -> Balanced:
        """``sticky.lua`` ``balance()`` for one attempt of one request.

        Args:
            cookie: the raw value of the affinity cookie in the request, or None.
            last_failed: this attempt is a retry after a failed one (``get_last_failure()``).
            tried: the nodes this request already tried (``$upstream_addr``).
            location_declared: ``should_set_cookie`` for the request's host and location.
            rng, now_s, worker_pid: the randomness, ``ngx.now()`` and ``ngx.worker.pid()``.
        """
        key, _ = parse_cookie_value(cookie)
        from_cookie = self.find(key) if key else None
        pick_new = (last_failed and self.affinity.change_on_failure) or from_cookie is None
        if not pick_new:
            return Balanced(node=from_cookie)
        node, new_key = self.pick_new_upstream(tried, rng=rng, now_s=now_s, worker_pid=worker_pid)
        if node is None:
            return Balanced(node=None)
        return Balanced(node=node, new_key=new_key, set_cookie=location_declared)

    def cookie_of(self, request_cookie_header: str | None) -> str | None:
        """The raw affinity cookie value in a ``Cookie`` header (lua-resty-cookie's ``get``)."""
        if not request_cookie_header:
            return None
        return parse_cookie_header(request_cookie_header).get(self.affinity.name)


def should_set_cookie(locations: Mapping[str, Collection[str]], *, host: str, default_server: bool,
                      location_path: str) -> bool:
    """``sticky.lua`` ``should_set_cookie``: is ``(host, location_path)`` an affinity location?

    ``locations`` maps hosts (``_`` for the default server, wildcards as ``*.example.com``) to the
    paths of the Ingress rules that enabled affinity. A host without an entry falls back to its
    wildcard (the first label replaced by ``*``).
    """
    lookup = "_" if default_server else host
    locs = locations.get(lookup)
    if locs is None and "." in lookup:
        locs = locations.get("*." + lookup.split(".", 1)[1])
    return locs is not None and location_path in locs


def set_cookie_header(affinity: CookieAffinity, *, value: str, location_path: str, https: bool,
                      user_agent: str, now_s: float) -> str:
    """The ``Set-Cookie`` value ``sticky.lua`` ``set_cookie`` sends.

    Path is the annotation or else the matched location path; Secure is the annotation when true,
    else whether the request came over HTTPS (a false annotation arrives as nil in Lua);
    ``SameSite=None`` is dropped for incompatible user agents under
    ``conditional-samesite-none``; Expires is ``cookie_time(time() + expires)``.
    """
    samesite = affinity.samesite
    if (samesite is not None and affinity.conditional_samesite_none and samesite == "None"
            and not same_site_none_compatible(user_agent)):
        samesite = None
    return bake_set_cookie(SetCookie(
        name=affinity.name,
        value=value,
        expires=(cookie_time(int(now_s) + affinity.expires_s) if affinity.expires_s is not None else None),
        max_age=affinity.max_age_s,
        domain=affinity.domain,
        path=affinity.path if affinity.path is not None else location_path,
        secure=True if affinity.secure else https,
        httponly=True,
        samesite=samesite,
    ))
