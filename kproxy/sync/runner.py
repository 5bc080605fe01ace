"""A bounded-frequency runner, as kube-proxy's ``BoundedFrequencyRunner`` (pkg/util/async).

Theory of operation
-------------------
The runner calls one async function (a sync) so that:

* a run happens no sooner than ``min_interval_s`` after the previous run ended (BFR measures
  from the end too: it records ``lastRun`` after ``fn()`` returns);
* a run happens no later than ``max_interval_s`` after the previous one (the periodic resync);
* :meth:`BoundedFrequencyRunner.request` asks for a run; every request made while one is
  pending, or while a run is in progress, coalesces into one further run;
* a run that raises is logged and retried ``retry_interval_s`` after it ended, still no sooner
  than ``min_interval_s``. kube-proxy's proxiers call ``syncRunner.RetryAfter(syncPeriod)`` on a
  failed sync, so the default retry interval is ``max_interval_s``: a retry then coincides with
  the periodic resync. A request arriving meanwhile triggers the retry sooner (at
  ``min_interval_s``), since every run re-applies the whole state.

A run interrupted by cancellation leaves the runner PENDING, so that a restarted loop redoes
it at once. Unlike BFR there is no burst allowance (kube-proxy passes ``burstSyncs=2``): runs are spaced by
at least ``min_interval_s`` always, which is simpler to reason about and to test.

The decisions are pure: :data:`TRANSITIONS` maps ``(state, event)`` to the next state and
:func:`next_due` says when the ``DUE`` event fires in a state. The loop in
:meth:`BoundedFrequencyRunner.run` only sleeps until then (or until a request) and calls the
function.

The state diagram is generated from the table: :func:`diagram`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

import structlog

from kproxy.clock import Clock, MonotonicClock
from kproxy.errors import InvalidArgument, InvalidTransition

__all__ = [
    "REASONS",
    "TRANSITIONS",
    "BoundedFrequencyRunner",
    "RunReason",
    "RunnerEvent",
    "RunnerState",
    "RunnerTiming",
    "diagram",
    "next_due",
    "transition",
]

_log = structlog.get_logger("kproxy.sync")

#: Float slack when comparing a deadline with the clock: ``now + (due - now)`` may round.
_EPSILON_S = 1e-9


class RunnerState(StrEnum):
    """Where the runner is; see the module diagram."""

    IDLE = "IDLE"
    PENDING = "PENDING"
    RETRY_WAIT = "RETRY_WAIT"
    RUNNING = "RUNNING"
    RUNNING_PENDING = "RUNNING_PENDING"
    ERROR = "ERROR"


class RunnerEvent(StrEnum):
    """What can happen to the runner."""

    REQUEST = "REQUEST"
    DUE = "DUE"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class RunReason(StrEnum):
    """Why a run happens; passed to the function."""

    REQUESTED = "REQUESTED"
    PERIODIC = "PERIODIC"
    RETRY = "RETRY"


S, E = RunnerState, RunnerEvent

#: The runner's state machine: ``(state, event) -> next state``. Pairs not listed are illegal.
TRANSITIONS: Mapping[tuple[RunnerState, RunnerEvent], RunnerState] = MappingProxyType({
    (S.IDLE, E.REQUEST): S.PENDING,
    (S.IDLE, E.DUE): S.RUNNING,
    (S.PENDING, E.REQUEST): S.PENDING,
    (S.PENDING, E.DUE): S.RUNNING,
    (S.RETRY_WAIT, E.REQUEST): S.PENDING,
    (S.RETRY_WAIT, E.DUE): S.RUNNING,
    (S.RUNNING, E.REQUEST): S.RUNNING_PENDING,
    (S.RUNNING, E.SUCCEEDED): S.IDLE,
    (S.RUNNING, E.FAILED): S.RETRY_WAIT,
    (S.RUNNING, E.CANCELLED): S.PENDING,
    (S.RUNNING_PENDING, E.REQUEST): S.RUNNING_PENDING,
    (S.RUNNING_PENDING, E.SUCCEEDED): S.PENDING,
    (S.RUNNING_PENDING, E.FAILED): S.PENDING,
    (S.RUNNING_PENDING, E.CANCELLED): S.PENDING,
})

#: Why a ``DUE`` event in a state leads to a run.
REASONS: Mapping[RunnerState, RunReason] = MappingProxyType({
    S.IDLE: RunReason.PERIODIC,
    S.PENDING: RunReason.REQUESTED,
    S.RETRY_WAIT: RunReason.RETRY,
})


def transition(state: RunnerState, event: RunnerEvent) -> RunnerState:
    """The state after ``event`` in ``state``.

    Raises:
        InvalidTransition: the pair is not in :data:`TRANSITIONS`.
    """
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(
            f"runner: event {event} is illegal in state {state} (role: bounded-frequency runner)"
        ) from None


def diagram() -> str:
    """The runner's state machine as a Mermaid ``stateDiagram-v2``, generated from :data:`TRANSITIONS`."""
    lines = ["stateDiagram-v2", f"    [*] --> {RunnerState.IDLE}"]
    lines += [f"    {src} --> {dst}: {event}" for (src, event), dst in TRANSITIONS.items()]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerTiming:
    """The runner's intervals, in seconds, validated.

    Attributes:
        min_interval_s: the least time between the end of a run and the start of the next.
        max_interval_s: the most time between two runs (periodic resync).
        retry_interval_s: the time after a failed run before it is retried.

    Raises:
        InvalidArgument: a negative or non-finite interval, ``max_interval_s`` < ``min_interval_s``,
            or a non-positive ``max_interval_s`` or ``retry_interval_s``.
    """

    min_interval_s: float
    max_interval_s: float
    retry_interval_s: float

    def __post_init__(self) -> None:
        for name in ("min_interval_s", "max_interval_s", "retry_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                raise InvalidArgument(f"{name} must be a number of seconds, got {value!r}")
            if value < 0:
                raise InvalidArgument(f"{name} must be >= 0 seconds, got {name}={value}")
        if self.max_interval_s <= 0 or math.isinf(self.min_interval_s):
            raise InvalidArgument(
                f"expected 0 <= min_interval_s (finite) and max_interval_s > 0, got "
                f"min_interval_s={self.min_interval_s}, max_interval_s={self.max_interval_s}")
        if self.max_interval_s < self.min_interval_s:
            raise InvalidArgument(
                f"max_interval_s ({self.max_interval_s}) must be >= min_interval_s "
                f"({self.min_interval_s}), as BoundedFrequencyRunner requires; lower min_interval_s "
                "or raise max_interval_s")
        if self.retry_interval_s <= 0:
            raise InvalidArgument(f"retry_interval_s must be > 0 seconds, got {self.retry_interval_s}")


def next_due(
    state: RunnerState, timing: RunnerTiming, *, started_at: float, last_run_end: float | None
) -> float:
    """When the ``DUE`` event fires in ``state`` (absolute seconds; ``inf`` for never).

    Args:
        state: the current state.
        timing: the intervals.
        started_at: when the runner started (the periodic timer starts then, as BFR's).
        last_run_end: when the last run ended, or None before the first run.
    """
    if state in (S.RUNNING, S.RUNNING_PENDING, S.ERROR):
        return math.inf
    base = started_at if last_run_end is None else last_run_end
    periodic = base + timing.max_interval_s
    earliest = -math.inf if last_run_end is None else last_run_end + timing.min_interval_s
    if state is S.PENDING:
        return earliest
    if state is S.RETRY_WAIT:
        return min(periodic, max(earliest, base + timing.retry_interval_s))
    return periodic


class BoundedFrequencyRunner:
    """Run an async function at a bounded frequency, as kube-proxy's ``BoundedFrequencyRunner``.

    Args:
        fn: the function to run; it gets the :class:`RunReason`. An exception it raises is logged
            and the run is retried (``asyncio.CancelledError`` is not caught).
        min_interval_s: seconds from the end of a run before the next may start (>= 0).
        max_interval_s: seconds after which a run happens without a request (> 0, >= min).
        retry_interval_s: seconds after a failed run before it is retried; None means
            ``max_interval_s``, as kube-proxy's ``RetryAfter(syncPeriod)``.
        clock: the time source (default :class:`MonotonicClock`).
        name: for log messages.

    Raises:
        InvalidArgument: bad intervals (see :class:`RunnerTiming`).
    """

    def __init__(
        self,
        fn: Callable[[RunReason], Awaitable[None]],
        *,
        min_interval_s: float,
        max_interval_s: float,
        retry_interval_s: float | None = None,
        clock: Clock | None = None,
        name: str = "sync-runner",
    ) -> None:
        self._fn = fn
        self.timing = RunnerTiming(
            min_interval_s=min_interval_s, max_interval_s=max_interval_s,
            retry_interval_s=max_interval_s if retry_interval_s is None else retry_interval_s)
        self._clock: Clock = clock or MonotonicClock()
        self._name = name
        self._state = RunnerState.IDLE
        self._started_at: float | None = None
        self._last_run_end: float | None = None
        self._wake = asyncio.Event()
        self.run_count = 0
        self.failure_count = 0

    @property
    def state(self) -> RunnerState:
        """The current state."""
        return self._state

    @property
    def last_run_end(self) -> float | None:
        """When the last run ended (seconds, clock time), or None before the first."""
        return self._last_run_end

    def next_due_at(self) -> float:
        """When the next run is due (seconds, clock time; ``inf`` while running or not started)."""
        if self._started_at is None:
            return math.inf
        return next_due(self._state, self.timing, started_at=self._started_at,
                        last_run_end=self._last_run_end)

    def request(self) -> None:
        """Ask for a run (BFR's ``Run()``): it happens as soon as ``min_interval_s`` allows.

        Requests coalesce; calling this before :meth:`run` starts is allowed.
        """
        self._fire(RunnerEvent.REQUEST)
        self._wake.set()

    async def run(self) -> None:
        """Run the loop until cancelled (BFR's ``Loop``).

        Raises:
            InvalidTransition: an internal inconsistency (the runner moves to ERROR).
        """
        self._started_at = self._clock.now()
        while True:
            now = self._clock.now()
            due = self.next_due_at()
            if due - now > _EPSILON_S:
                self._wake.clear()
                await _sleep_or_wake(self._clock, due - now, self._wake)
                continue
            reason = REASONS[self._state]
            self._fire(RunnerEvent.DUE)
            try:
                await self._fn(reason)
            except asyncio.CancelledError:
                # The interrupted run must be redone if the loop is started again.
                self._fire(RunnerEvent.CANCELLED)
                raise
            except Exception as err:
                self._last_run_end = self._clock.now()
                self.run_count += 1
                self.failure_count += 1
                self._fire(RunnerEvent.FAILED)
                retry_in_s = max(self.next_due_at() - self._clock.now(), 0.0)
                _log.error(f"sync failed; retrying in {retry_in_s:.1f} s (sooner when a change arrives)",
                           runner=self._name, reason=str(reason), error=_one_line(err),
                           retry_in_s=round(retry_in_s, 3))
                _log.debug("sync failure traceback", runner=self._name, exc_info=err)
            else:
                self._last_run_end = self._clock.now()
                self.run_count += 1
                self._fire(RunnerEvent.SUCCEEDED)

    def _fire(self, event: RunnerEvent) -> None:
        try:
            self._state = transition(self._state, event)
        except InvalidTransition:
            self._state = RunnerState.ERROR
            raise


def _one_line(err: BaseException) -> str:
    """``err`` as one line: its message (a group's names each failure), else its kind."""
    return " ".join(str(err).split()) if str(err) else type(err).__name__


async def _sleep_or_wake(clock: Clock, seconds: float, wake: asyncio.Event) -> None:
    """Return after ``seconds`` on ``clock`` or as soon as ``wake`` is set, whichever is first."""
    if wake.is_set():
        return
    async with asyncio.TaskGroup() as tg:
        sleeper = tg.create_task(clock.sleep(seconds))
        waiter = tg.create_task(wake.wait())
        sleeper.add_done_callback(lambda _: waiter.cancel())
        waiter.add_done_callback(lambda _: sleeper.cancel())
