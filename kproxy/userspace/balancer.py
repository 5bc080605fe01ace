"""A pure round-robin balancer with ClientIP session affinity, one per service port.

Theory of operation: this is kube-proxy's legacy userspace ``roundrobin.go`` (``LoadBalancerRR``)
reduced to one service port and stripped of I/O, locks and clocks.

* ``endpoints`` is an ordered tuple of ``ip:port`` strings and ``index`` the next one to hand out.
* With affinity on (``affinity_ttl_s`` not None) an affinity map ``{client_ip: (endpoint,
  last_used_s)}`` pins a client to the endpoint it got last, while ``now_s - last_used_s < ttl``;
  every hit refreshes ``last_used_s``. Expiry is lazy on lookup, plus :meth:`cleanup_stale_affinity`
  (kube-proxy's ``CleanupStaleStickySessions``, run on every sync).
* On an endpoint-set change the entries whose endpoint left are dropped (``removeStaleAffinity``)
  and ``index`` is reset to 0; an empty set wipes the whole map (``resetService``).
* Order: kube-proxy shuffled the list (``ShuffleStrings``) on every change. Here the order is the
  endpoints sorted by address unless a ``random.Random`` is injected, in which case it is shuffled
  with it. Sorted order keeps tests and the cross-mode equivalence checks deterministic.

Time is always an argument (float seconds from any monotonic clock); nothing here reads a clock.
The balancer also keeps per-endpoint active-connection counts for the relays (acquire/release);
counts for an endpoint that left survive until its last connection is released.
"""

from __future__ import annotations

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
        rng: when given, endpoint order is shuffled with it on every change (as kube-proxy's
            ``ShuffleStrings``); otherwise the order is sorted by address.

    Raises:
        InvalidArgument: ``affinity_ttl_s`` is negative.
    """

    __slots__ = ("_affinity", "_connections", "_endpoints", "_index", "_name", "_rng", "_ttl_s")

    def __init__(
        self,
        endpoints: Iterable[str] = (),
        *,
        affinity_ttl_s: float | None = None,
        name: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self._name = name
        self._rng = rng
        self._ttl_s: float | None = None
        self._affinity: dict[str, tuple[str, float]] = {}
        self._connections: dict[str, int] = {}
        self._endpoints: tuple[str, ...] = ()
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
        endpoint that left are dropped, the order is recomputed and the index reset to 0. An
        empty set also wipes the affinity map (``resetService``).

        Args:
            endpoints: ``ip:port`` strings.

        Returns:
            True when the set changed.
        """
        new = sorted(set(endpoints))
        if set(new) == set(self._endpoints):
            return False
        if not new:
            self._affinity.clear()
        else:
            keep = set(new)
            for client, (ep, _) in list(self._affinity.items()):
                if ep not in keep:
                    del self._affinity[client]
            if self._rng is not None:
                self._rng.shuffle(new)
        self._endpoints = tuple(new)
        self._index = 0
        return True

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
        chosen = self._endpoints[self._index % len(self._endpoints)]
        self._index = (self._index + 1) % len(self._endpoints)
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
