"""A pure round-robin balancer with ClientIP session affinity, one per service port.

Theory of operation: this is kube-proxy's legacy userspace ``roundrobin.go`` (``LoadBalancerRR``)
reduced to one service port and stripped of I/O, locks and clocks.

* ``endpoints`` is an ordered tuple of ``ip:port`` strings and ``index`` the next one to hand out.
  The order is a fixed total order over *all* possible endpoints (see "Order"), so the rotation
  has a position that survives changes: the key of the endpoint handed out last.
* With affinity on (``affinity_ttl_s`` not None) an affinity map ``{client_ip: (endpoint,
  last_used_s)}`` pins a client to the endpoint it got last, while ``now_s - last_used_s < ttl``;
  every hit refreshes ``last_used_s``. Expiry is lazy on lookup, plus :meth:`cleanup_stale_affinity`
  (kube-proxy's ``CleanupStaleStickySessions``, run on every sync).
* On an endpoint-set change the entries whose endpoint left are dropped (``removeStaleAffinity``);
  an empty set wipes the whole map (``resetService``). The rotation then *continues* with the first
  endpoint after the one handed out last, in the new order (whether or not that one is still
  there). kube-proxy reset ``index`` to 0 and relied on its reshuffle to spread load; with a
  deterministic order a reset would send every pick after each change to the same first endpoint
  (one flapping endpoint starved the rest). Continuing instead means the rotation never skips an
  endpoint: between two picks of an endpoint that stays present, every other pick is a distinct
  endpoint, so it is picked at least once in any window of as many picks as there were distinct
  endpoints in the window.
* Order: kube-proxy shuffled the list (``ShuffleStrings``) on every change. Here the order is the
  endpoints sorted by address unless a ``random.Random`` is injected; then it is sorted by a keyed
  hash (a seed drawn once from the Random), a shuffle that stays the same across changes, so that
  balancers of different proxies start at different endpoints while the rotation above still
  holds. Sorted order keeps tests and the cross-mode equivalence checks deterministic.

Time is always an argument (float seconds from any monotonic clock); nothing here reads a clock.
The balancer also keeps per-endpoint active-connection counts for the relays (acquire/release);
counts for an endpoint that left survive until its last connection is released.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from kproxy.errors import InvalidArgument, NoEndpointsError

__all__ = ["DEFAULT_AFFINITY_TTL_S", "RoundRobinBalancer"]

#: What roundrobin.go used when ``timeoutSeconds`` was 0: ``v1.DefaultClientIPServiceAffinitySeconds``.
DEFAULT_AFFINITY_TTL_S = 10800.0


class RoundRobinBalancer:
    """Round-robin endpoint choice with optional ClientIP affinity, as kube-proxy's ``roundrobin.go``.

    Mutable by nature (an index, an affinity map and connection counts), but pure: no I/O, no
    clock, no global randomness. Not thread-safe; one event loop owns it.

    Args:
        endpoints: the endpoints, ``ip:port`` strings (duplicates are folded).
        affinity_ttl_s: ClientIP affinity timeout in seconds; None turns affinity off; 0 means
            :data:`DEFAULT_AFFINITY_TTL_S`, as roundrobin.go did.
        name: a label for error messages (the ServicePortName text).
        rng: when given, one seed is drawn from it and the endpoint order is a keyed-hash shuffle
            (kube-proxy's ``ShuffleStrings``, but the same across changes); otherwise the order
            is sorted by address.

    Raises:
        InvalidArgument: ``affinity_ttl_s`` is negative.
    """

    __slots__ = ("_affinity", "_connections", "_endpoints", "_index", "_keys", "_last_key", "_name", "_seed",
                 "_ttl_s")

    def __init__(
        self,
        endpoints: Iterable[str] = (),
        *,
        affinity_ttl_s: float | None = None,
        name: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self._name = name
        self._seed: bytes | None = None if rng is None else rng.getrandbits(128).to_bytes(16, "big")
        self._ttl_s: float | None = None
        self._affinity: dict[str, tuple[str, float]] = {}
        self._connections: dict[str, int] = {}
        self._endpoints: tuple[str, ...] = ()
        self._keys: tuple[str | bytes, ...] = ()  # the sort key of each endpoint, ascending
        self._last_key: str | bytes | None = None  # the key of the endpoint handed out last
        self._index = 0
        self.set_affinity(affinity_ttl_s)
        self.update(endpoints)

    def __repr__(self) -> str:
        return (f"RoundRobinBalancer(name={self._name!r}, endpoints={self._endpoints!r}, "
                f"index={self._index}, affinity_ttl_s={self._ttl_s!r})")

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints in hand-out order (``ip:port`` strings)."""
        return self._endpoints

    @property
    def affinity_ttl_s(self) -> float | None:
        """The ClientIP affinity timeout in seconds, or None when affinity is off."""
        return self._ttl_s

    @property
    def affinity(self) -> Mapping[str, tuple[str, float]]:
        """A read-only view ``{client_ip: (endpoint, last_used_s)}`` of the affinity map."""
        return MappingProxyType(self._affinity)

    def set_affinity(self, ttl_s: float | None) -> None:
        """Turn affinity on with ``ttl_s`` seconds (0 means 10800 s) or off with None.

        Turning it off, or changing the timeout, clears the affinity map.

        Raises:
            InvalidArgument: ``ttl_s`` is negative.
        """
        if ttl_s is not None and ttl_s < 0:
            raise InvalidArgument(f"affinity_ttl_s must be >= 0 seconds or None, got {ttl_s=}")
        new = None if ttl_s is None else (float(ttl_s) or DEFAULT_AFFINITY_TTL_S)
        if new != self._ttl_s:
            self._affinity.clear()
        self._ttl_s = new

    def update(self, endpoints: Iterable[str]) -> bool:
        """Replace the endpoint set (kube-proxy's ``OnEndpointsUpdate``).

        Nothing happens when the *set* is unchanged. Otherwise affinity entries pointing at an
        endpoint that left are dropped and the rotation continues with the first endpoint, in the
        new order, after the one handed out last. An empty set also wipes the affinity map
        (``resetService``).

        Args:
            endpoints: ``ip:port`` strings.

        Returns:
            True when the set changed.
        """
        new = set(endpoints)
        if new == set(self._endpoints):
            return False
        if not new:
            self._affinity.clear()
        else:
            for client, (ep, _) in list(self._affinity.items()):
                if ep not in new:
                    del self._affinity[client]
        ordered = sorted((self._key(ep), ep) for ep in new)
        self._keys = tuple(k for k, _ in ordered)
        self._endpoints = tuple(ep for _, ep in ordered)
        self._index = self._resume_index()
        return True

    def _key(self, endpoint: str) -> str | bytes:
        if self._seed is None:
            return endpoint
        return hashlib.blake2b(endpoint.encode(), key=self._seed, digest_size=16).digest()

    def _resume_index(self) -> int:
        """The position of the first endpoint after the one handed out last (0 when none was)."""
        if self._last_key is None or not self._keys:
            return 0
        return bisect.bisect_right(self._keys, self._last_key) % len(self._keys)

    def next_endpoint(self, client_ip: str, now_s: float, reset_affinity: bool = False) -> str:
        """Choose the endpoint for a new connection or flow (roundrobin.go ``NextEndpoint``).

        Args:
            client_ip: the client's IP address (the affinity key; ignored without affinity).
            now_s: the current time in seconds from the same clock as earlier calls.
            reset_affinity: ignore a held affinity entry (a retry after a failed dial), but still
                record the new choice.

        Returns:
            The endpoint, an ``ip:port`` string.

        Raises:
            NoEndpointsError: the balancer has no endpoints.
        """
        if not self._endpoints:
            raise NoEndpointsError(
                f"service port {self._name or '?'} has no endpoints; "
                "check that its pods are ready and its EndpointSlices name the port")
        ttl = self._ttl_s
        if ttl is not None and not reset_affinity:
            held = self._affinity.get(client_ip)
            if held is not None and now_s - held[1] < ttl:
                self._affinity[client_ip] = (held[0], now_s)
                return held[0]
        index = self._index % len(self._endpoints)
        chosen = self._endpoints[index]
        self._last_key = self._keys[index]
        self._index = (index + 1) % len(self._endpoints)
        if ttl is not None:
            self._affinity[client_ip] = (chosen, now_s)
        return chosen

    def cleanup_stale_affinity(self, now_s: float) -> int:
        """Drop affinity entries whose age is >= the timeout (``CleanupStaleStickySessions``).

        Returns:
            How many entries were dropped.
        """
        ttl = self._ttl_s
        if ttl is None:
            return 0
        stale = [c for c, (_, used) in self._affinity.items() if now_s - used >= ttl]
        for client in stale:
            del self._affinity[client]
        return len(stale)

    def acquire(self, endpoint: str) -> None:
        """Count one more active connection (or UDP session) to ``endpoint``."""
        self._connections[endpoint] = self._connections.get(endpoint, 0) + 1

    def release(self, endpoint: str) -> None:
        """Count one connection to ``endpoint`` fewer.

        Raises:
            InvalidArgument: ``endpoint`` has no active connection (an unbalanced release).
        """
        count = self._connections.get(endpoint, 0)
        if count <= 0:
            raise InvalidArgument(f"release of {endpoint!r} without a matching acquire")
        if count == 1:
            del self._connections[endpoint]
        else:
            self._connections[endpoint] = count - 1

    def active_connections(self, endpoint: str | None = None) -> int:
        """Active connections to ``endpoint``, or to every endpoint when None."""
        if endpoint is None:
            return sum(self._connections.values())
        return self._connections.get(endpoint, 0)

    def connection_counts(self) -> Mapping[str, int]:
        """A read-only view ``{endpoint: active connections}`` (endpoints with none are absent)."""
        return MappingProxyType(self._connections)
