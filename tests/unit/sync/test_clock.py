"""FakeClock: time moves only when told, and sleepers wake at their exact deadline."""

from __future__ import annotations

import asyncio

import pytest

from kproxy.errors import InvalidArgument
from kproxy.sync import Clock, FakeClock, MonotonicClock, settle


async def test_sleeper_wakes_at_its_deadline_inside_run_for() -> None:
    """A task sleeping 1.5 s observes now() == 1.5 even when the test runs 10 s at once."""
    clock = FakeClock()
    seen: list[float] = []

    async def sleeper() -> None:
        await clock.sleep(1.5)
        seen.append(clock.now())
        await clock.sleep(2.0)
        seen.append(clock.now())

    async with asyncio.TaskGroup() as tg:
        tg.create_task(sleeper())
        await clock.run_for(10)
    assert seen == [1.5, 3.5]
    assert clock.now() == 10


async def test_advance_wakes_only_passed_deadlines() -> None:
    """advance() resolves the sleepers whose deadline passed and leaves the others asleep."""
    clock = FakeClock(start=5.0)
    async with asyncio.TaskGroup() as tg:
        early = tg.create_task(clock.sleep(1))
        late = tg.create_task(clock.sleep(3))
        await settle()
        clock.advance(2)
        await settle()
        assert early.done() and not late.done()
        assert clock.next_deadline == 8.0
        clock.advance(1)
    assert clock.sleeper_count == 0


async def test_cancelled_sleeper_is_forgotten() -> None:
    """A cancelled sleep no longer counts as a sleeper."""
    clock = FakeClock()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(clock.sleep(1))
        await settle()
        task.cancel()
    assert clock.next_deadline is None


def test_time_cannot_go_backwards() -> None:
    """A negative advance raises InvalidArgument naming the value."""
    with pytest.raises(InvalidArgument, match="seconds=-1"):
        FakeClock().advance(-1)


def test_clocks_satisfy_the_protocol() -> None:
    """Both clocks are Clocks."""
    assert isinstance(FakeClock(), Clock)
    assert isinstance(MonotonicClock(), Clock)
