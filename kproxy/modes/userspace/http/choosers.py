"""Per-backend endpoint choice for the HTTP plane: sticky cookie, hash-by, round robin, Envoy hashing.

ingress-nginx's ``balancer.lua`` ``get_implementation`` picks one balancer per backend: cookie
affinity (``sticky_balanced`` / ``sticky_persistent``) wins, then ``upstream-hash-by``
(``chash``), else ``round_robin`` (lua-resty-balancer ``roundrobin`` with every weight 1, a
plain rotation; here it starts at the first node in sorted order). Each is built once per
endpoint set (``sync`` / ``reinit``) and asked once per attempt of a request.

:class:`EnvoyChooser` is Istio's sidecar for a Service port with a DestinationRule
``consistentHash``: Envoy's request hash over a ring-hash or Maglev table, random without a hash,
and on a retry Envoy's ``attempt`` offset.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass

from kproxy.model import ConsistentHash, HashAlgorithm, HashKey
from kproxy.modes.userspace.http.envoy_hash import HashPolicy, HashPolicyKind, HashRequest, request_hash
from kproxy.modes.userspace.http.envoy_lb import (
    DEFAULT_MAGLEV_TABLE_SIZE,
    DEFAULT_MIN_RING_SIZE,
    Maglev,
    RingHash,
)
from kproxy.modes.userspace.http.hashby import HashByRequest, HashByTemplate
from kproxy.modes.userspace.http.routing import Backend
from kproxy.modes.userspace.http.sticky import (
    StickyBalancer,
    cookie_value,
    set_cookie_header,
    should_set_cookie,
)

__all__ = ["Attempt", "Choice", "EnvoyChooser", "IngressChooser"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """What one attempt of one request knows.

    Attributes:
        host: the Host (no port); default_server: the request matched the ``_`` server.
        location_path: the matched location's path.
        cookie_header: the joined ``Cookie`` headers, or None.
        request: the variables ``upstream-hash-by`` reads.
        user_agent: the ``User-Agent``; https: the request came over TLS.
        last_failed: a previous attempt of this request failed; tried: the nodes tried so far.
        now_s: wall-clock seconds (``ngx.now()``).
    """

    host: str
    default_server: bool
    location_path: str
    cookie_header: str | None
    request: HashByRequest
    user_agent: str = ""
    https: bool = False
    last_failed: bool = False
    tried: Collection[str] = ()
    now_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """A node (``address:port``) or None (no peer: 502), and the ``Set-Cookie`` values to send."""

    node: str | None
    set_cookies: tuple[str, ...] = ()


class IngressChooser:
    """The balancer of one ingress-nginx backend.

    Args:
        backend: the backend (at least one node).
        rng: the randomness (keys, persistent picks).
        worker_pid: the id in balanced keys (``ngx.worker.pid()``).
    """

    __slots__ = ("_hash", "_next", "_rng", "_sticky", "_worker_pid", "backend")

    def __init__(self, backend: Backend, *, rng: random.Random, worker_pid: int) -> None:
        self.backend = backend
        self._rng = rng
        self._worker_pid = worker_pid
        self._next = 0
        self._sticky = (StickyBalancer(name=backend.name, nodes=backend.nodes, affinity=backend.affinity)
                        if backend.affinity is not None else None)
        self._hash = (HashByTemplate(backend.hash_by, list(backend.nodes))
                      if backend.hash_by and self._sticky is None else None)

    @property
    def hashes_requests(self) -> bool:
        """Whether :meth:`choose` reads ``attempt.request`` (``upstream-hash-by``)."""
        return self._hash is not None

    def choose(self, attempt: Attempt) -> Choice:
        """The node for this attempt and any cookie ``balance()`` sets."""
        if self._sticky is not None:
            sticky = self._sticky
            # balance() sets a cookie only on a new pick, so the location lookup waits for one
            r = sticky.balance(cookie=sticky.cookie_of(attempt.cookie_header),
                               last_failed=attempt.last_failed, tried=attempt.tried,
                               location_declared=True, rng=self._rng,
                               now_s=attempt.now_s, worker_pid=self._worker_pid)
            cookies: tuple[str, ...] = ()
            if r.set_cookie and r.new_key is not None and should_set_cookie(
                    self.backend.locations, host=attempt.host, default_server=attempt.default_server,
                    location_path=attempt.location_path):
                cookies = (set_cookie_header(sticky.affinity, value=cookie_value(r.new_key, sticky.name),
                                             location_path=attempt.location_path, https=attempt.https,
                                             user_agent=attempt.user_agent, now_s=attempt.now_s),)
            return Choice(node=r.node, set_cookies=cookies)
        if self._hash is not None:
            return Choice(node=self._hash.find(attempt.request))
        nodes = self.backend.nodes
        for _ in range(len(nodes)):
            node = nodes[self._next % len(nodes)]
            self._next += 1
            if node not in attempt.tried:
                return Choice(node=node)
        return Choice(node=nodes[self._next % len(nodes)])


def _policies(ch: ConsistentHash) -> tuple[HashPolicy, ...]:
    kind = {HashKey.HEADER: HashPolicyKind.HEADER, HashKey.COOKIE: HashPolicyKind.COOKIE,
            HashKey.SOURCE_IP: HashPolicyKind.SOURCE_IP,
            HashKey.QUERY_PARAMETER: HashPolicyKind.QUERY_PARAMETER}[ch.key]
    return (HashPolicy(kind=kind, name=ch.name, path=ch.cookie_path, ttl_s=ch.cookie_ttl_s),)


class EnvoyChooser:
    """Istio's ``consistentHash`` for one Service port, as its Envoy sidecar balances.

    Args:
        hosts: the endpoints as Envoy host keys (``ip:port``, IPv6 bracketed), at least one.
        policy: the DestinationRule's consistent hash (already port-level over top-level).
        rng: the randomness for requests without a hash.

    Raises:
        InvalidArgument: no host, or a Maglev table size that is not prime.
    """

    __slots__ = ("_lb", "_policies", "_rng")

    def __init__(self, hosts: Collection[str], policy: ConsistentHash, *, rng: random.Random) -> None:
        ordered = sorted(hosts)
        self._lb: RingHash | Maglev
        if policy.algorithm is HashAlgorithm.MAGLEV:
            self._lb = Maglev(ordered, table_size=policy.size or DEFAULT_MAGLEV_TABLE_SIZE)
        else:
            self._lb = RingHash(ordered, min_ring_size=policy.size or DEFAULT_MIN_RING_SIZE)
        self._policies = _policies(policy)
        self._rng = rng

    def choose(self, request: HashRequest, attempt: int = 0) -> tuple[str, tuple[str, ...]]:
        """``(host key, Set-Cookie values)`` for ``request``'s ``attempt`` (0 first)."""
        result = request_hash(self._policies, request)
        h = result.hash if result.hash is not None else self._rng.getrandbits(64)
        return self._lb.choose(h, attempt), result.set_cookies
