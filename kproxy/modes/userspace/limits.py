"""What the userspace data plane may hold open, sized from RLIMIT_NOFILE, and running out of it.

Theory of operation. Every relayed TCP connection holds two file descriptors (the client's and the
endpoint's), every UDP session one (its socket connected to the endpoint). Unbounded, a UDP flood
from many client addresses or a burst of connections takes every descriptor of the process, and
then the manifests scan, the metrics server and every new dial fail with EMFILE. So:

* :class:`ConnectionLimits` caps TCP connections and UDP sessions per service port and in total.
  :meth:`ConnectionLimits.from_nofile` sizes the defaults from the soft ``RLIMIT_NOFILE``: a
  quarter of the limit (at least :data:`RESERVED_FDS_MIN`) is kept for listeners, the source,
  observability and logs; of the rest, half goes to TCP (two descriptors a connection) and half
  to UDP (one a session); one service port may use half of each total, so one flooded Service
  cannot starve the others. Over a cap, a new TCP connection is reset at once (Envoy's
  ``max_connections`` circuit breaker overflows the same way) and a new UDP flow evicts the
  least recently active session (the per-service one, else the oldest of the whole proxy), as
  conntrack's ``early_drop`` makes room in a full table.
* :func:`out_of_resources` tells a local shortage (EMFILE, ENFILE, ENOBUFS, ENOMEM; for a
  dial also EADDRNOTAVAIL, no ephemeral port left) from an endpoint's failure, so running out of
  descriptors is never logged or counted as an endpoint's dial failure.
* :class:`Episode` logs such a condition once when it starts, with what is done about it, and once
  when it ends, with how many times it hit in between, instead of a line per event. It ends on a
  success at least :data:`EPISODE_SETTLE_S` after its last hit, so a condition that flaps (a
  reset client frees the descriptor the next dial takes) stays one episode.
"""

from __future__ import annotations

import asyncio
import errno
import resource
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kproxy.errors import InvalidArgument

__all__ = [
    "EPISODE_SETTLE_S",
    "RESERVED_FDS_MIN",
    "Budget",
    "ConnectionLimits",
    "Episode",
    "nofile_soft_limit",
    "out_of_resources",
]

#: An episode ends on a success this many seconds after its last hit, not sooner (the accept
#: back-off's longest delay, so a retry cycle never ends it).
EPISODE_SETTLE_S = 1.0
#: Descriptors never handed to connections or sessions, at least (listeners, source, logs, metrics).
RESERVED_FDS_MIN = 64
#: Sizing treats an unlimited or huge RLIMIT_NOFILE as this many descriptors (the kernel's default
#: ``fs.nr_open``, 1,048,576).
_NOFILE_SIZING_MAX = 1 << 20

_FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_DIAL_ERRNOS = _FD_ERRNOS | {errno.EADDRNOTAVAIL}


def out_of_resources(exc: BaseException, *, dial: bool = False) -> bool:
    """True when ``exc`` is the process or the host running short, not a peer's failure.

    Args:
        exc: what a socket call raised.
        dial: the call was a connect(), where EADDRNOTAVAIL means no local port is left.
    """
    return isinstance(exc, OSError) and exc.errno in (_DIAL_ERRNOS if dial else _FD_ERRNOS)


def nofile_soft_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` of this process, in descriptors (unlimited counts as 2**20)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > _NOFILE_SIZING_MAX:
        return _NOFILE_SIZING_MAX
    return int(soft)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name} must be an int >= 1, got {name}={value!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """Caps on open TCP connections and UDP sessions (see the module docstring).

    Attributes:
        max_connections: relayed TCP connections open at once, all service ports together.
        max_connections_per_service: relayed TCP connections open at once on one service port.
        max_udp_sessions: UDP sessions open at once, all service ports together.
        max_udp_sessions_per_service: UDP sessions open at once on one service port.

    Raises:
        InvalidArgument: a value is not an int >= 1 (the message names the field).
    """

    max_connections: int
    max_connections_per_service: int
    max_udp_sessions: int
    max_udp_sessions_per_service: int

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_service", "max_udp_sessions",
                     "max_udp_sessions_per_service"):
            _positive(name, getattr(self, name))

    @classmethod
    def from_nofile(cls, nofile: int | None = None, **overrides: int | None) -> ConnectionLimits:
        """The default limits for ``nofile`` descriptors (default: this process's soft limit now).

        With ``nofile`` = 1024: 192 connections (96 per service port) and 384 UDP sessions (192
        per service port); with 1,048,576: 196,608 and 393,216 (half of each per port).

        Args:
            nofile: the descriptors the process may open.
            **overrides: fields to set instead of the sized default (None keeps the default).

        Raises:
            InvalidArgument: ``nofile`` or an override is not an int >= 1, or an unknown field.
        """
        fds = min(_positive("nofile", nofile if nofile is not None else nofile_soft_limit()),
                  _NOFILE_SIZING_MAX)
        budget = max(fds - max(RESERVED_FDS_MIN, fds // 4), 4)
        tcp, udp = max(budget // 4, 1), max(budget // 2, 1)
        sized = {"max_connections": tcp, "max_connections_per_service": max(tcp // 2, 1),
                 "max_udp_sessions": udp, "max_udp_sessions_per_service": max(udp // 2, 1)}
        unknown = sorted(set(overrides) - set(sized))
        if unknown:
            raise InvalidArgument(f"unknown connection limits {unknown}; known: {sorted(sized)}")
        sized.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**sized)


class Episode:
    """A condition logged once when it starts and once when it ends (see the module docstring).

    Args:
        logger: a structlog logger.
        event: what happened, e.g. ``"out of file descriptors"``.
        effect: what is done about it while it lasts, e.g. ``"new connections are reset"``.
        clock: float seconds, monotonic (default: the running event loop's time).
        settle_s: :meth:`clear` ends the episode only this many seconds after the last hit.
    """

    __slots__ = ("_clock", "_effect", "_event", "_last_hit_s", "_logger", "_settle_s", "active", "hits")

    def __init__(self, logger: Any, event: str, *, effect: str, clock: Callable[[], float] | None = None,
                 settle_s: float = EPISODE_SETTLE_S) -> None:
        self._logger = logger
        self._event = event
        self._effect = effect
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._settle_s = settle_s
        self._last_hit_s = 0.0
        self.active = False
        self.hits = 0

    def hit(self, **fields: object) -> None:
        """Count one occurrence; the first of an episode logs a warning with ``fields``."""
        self.hits += 1
        self._last_hit_s = self._clock()
        if not self.active:
            self.active = True
            self._logger.warning(self._event, effect=self._effect,
                                 until="it clears; one line will say so", **fields)

    def clear(self) -> None:
        """A success: end the episode (if one is open and settled), logging how many times it hit."""
        if self.active and self._clock() - self._last_hit_s >= self._settle_s:
            self._logger.info(f"{self._event}: cleared", occurrences=self.hits)
            self.active = False
            self.hits = 0


class Budget:
    """The limits and the logged episodes that every listener of one proxy shares.

    Attributes:
        limits: the caps.
        out_of_fds: the process ran out of descriptors (accept, dial or UDP session).
        tcp_full: a TCP connection cap was hit.
        udp_full: a UDP session cap was hit.
        udp_sessions: every open UDP session of the proxy, least recently active first (the
            values are unused; :meth:`touch` moves a session to the end).
    """

    __slots__ = ("limits", "out_of_fds", "tcp_full", "udp_full", "udp_sessions")

    def __init__(self, limits: ConnectionLimits, logger: Any) -> None:
        self.limits = limits
        self.out_of_fds = Episode(logger, "out of file descriptors",
                                  effect="clients wait in the accept queue or are reset, new UDP flows are "
                                         "dropped; no endpoint is blamed")
        self.tcp_full = Episode(logger, "TCP connection limit reached", effect="new connections are reset")
        self.udp_full = Episode(logger, "UDP session limit reached",
                                effect="each new flow closes the least recently active session")
        self.udp_sessions: OrderedDict[object, None] = OrderedDict()

    def touch(self, session: object) -> None:
        """Mark ``session`` (open) as the most recently active."""
        self.udp_sessions.move_to_end(session)
