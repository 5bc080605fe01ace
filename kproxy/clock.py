"""Injected time: the :class:`Clock` protocol, the real clock and a deterministic fake.

Nothing in kproxy reads the system clock directly; the runner, the engine and the sources take a
Clock (STYLE.md 6, after kube-proxy's ``BoundedFrequencyRunner`` timer and trio's ``MockClock``).
Times are float seconds on an arbitrary monotonic scale.

Theory of operation of :class:`FakeClock`: time only moves when a test says so. ``sleep(s)``
registers a future with the deadline ``now() + s``; :meth:`FakeClock.advance` moves time and
resolves the futures whose deadline passed. Waking a sleeper only schedules it, so tests that
need the woken tasks to have run use the async :meth:`FakeClock.run_for`, which jumps from
deadline to deadline (so a task woken at 1.0 observes ``now() == 1.0`` exactly) and lets the
event loop settle after each jump.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol, runtime_checkable

from kproxy.errors import InvalidArgument

__all__ = ["SETTLE_ITERATIONS", "Clock", "FakeClock", "MonotonicClock", "settle"]

#: Event-loop iterations :func:`settle` yields. A woken task chain (sleep -> runner -> engine ->
#: consumer -> event) needs a handful of iterations per hop; 64 leaves a wide margin and costs
#: microseconds. It is a count, not a duration, so it does not depend on machine speed.
SETTLE_ITERATIONS = 64


@runtime_checkable
class Clock(Protocol):
    """A source of time: ``now()`` in seconds and an awaitable ``sleep(seconds)``."""

    def now(self) -> float:
        """The current time in seconds (monotonic, arbitrary origin)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` (float seconds; <= 0 just yields) have passed."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic()`` and ``asyncio.sleep``."""

    def now(self) -> float:
        """``time.monotonic()`` in seconds."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep(max(seconds, 0))``."""
        await asyncio.sleep(max(seconds, 0.0))


async def settle(iterations: int = SETTLE_ITERATIONS) -> None:
    """Yield to the event loop ``iterations`` times so that every ready task runs to its next wait.

    Deterministic: it counts loop iterations, it never waits for wall-clock time.
    """
    for _ in range(iterations):
        await asyncio.sleep(0)


class FakeClock:
    """A clock that moves only when told to, for tests that assert exact times.

    Args:
        start: the initial time in seconds.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._seq = itertools.count()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def now(self) -> float:
        """The fake time in seconds."""
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Wait until the fake time reaches ``now() + seconds``; ``seconds <= 0`` only yields."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut  # a cancelled sleeper's future is cancelled too and skipped on wake-up

    @property
    def next_deadline(self) -> float | None:
        """The earliest deadline of a live sleeper, or None when nobody sleeps."""
        self._drop_cancelled()
        return self._sleepers[0][0] if self._sleepers else None

    @property
    def sleeper_count(self) -> int:
        """How many tasks are sleeping on this clock."""
        return sum(1 for _, _, fut in self._sleepers if not fut.done())

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and wake every sleeper whose deadline passed.

        Woken tasks run at the event loop's next iterations (see :func:`settle`).

        Raises:
            InvalidArgument: ``seconds`` is negative.
        """
        if seconds < 0:
            raise InvalidArgument(f"time cannot go backwards: expected seconds >= 0, got {seconds=}")
        self._set(self._now + seconds)

    async def run_for(self, seconds: float) -> None:
        """Advance ``seconds`` in steps, stopping at every sleeper's deadline and settling there.

        A task sleeping until 1.5 therefore sees ``now() == 1.5`` when it wakes, even inside
        ``run_for(10)``; sleeps started while stepping are honoured too.

        Raises:
            InvalidArgument: ``seconds`` is negative.
        """
        if seconds < 0:
            raise InvalidArgument(f"time cannot go backwards: expected seconds >= 0, got {seconds=}")
        target = self._now + seconds
        await settle()
        while (deadline := self.next_deadline) is not None and deadline <= target:
            self._set(max(deadline, self._now))
            await settle()
        self._set(target)
        await settle()

    def _set(self, now: float) -> None:
        self._now = now
        while self._sleepers and self._sleepers[0][0] <= now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    def _drop_cancelled(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
