"""The bounded-frequency runner: its table, its timing (exact, on a FakeClock) and its retries."""

from __future__ import annotations

import math

import pytest

from kproxy.errors import InvalidArgument, InvalidTransition
from kproxy.sync import (
    BoundedFrequencyRunner,
    FakeClock,
    RunnerEvent,
    RunnerState,
    RunnerTiming,
    RunReason,
    diagram,
    next_due,
)
from kproxy.sync.runner import TRANSITIONS, transition
from tests.unit.sync.builders import running

TIMING = RunnerTiming(min_interval_s=1.0, max_interval_s=30.0, retry_interval_s=5.0)


class Recorder:
    """A sync function that records (time, reason) and fails on chosen calls."""

    def __init__(self, clock: FakeClock, fail_on: set[int] | None = None, duration_s: float = 0.0):
        self.clock = clock
        self.fail_on = fail_on or set()
        self.duration_s = duration_s
        self.calls: list[tuple[float, RunReason]] = []

    async def __call__(self, reason: RunReason) -> None:
        self.calls.append((self.clock.now(), reason))
        if self.duration_s:
            await self.clock.sleep(self.duration_s)
        if len(self.calls) in self.fail_on:
            raise RuntimeError(f"sync {len(self.calls)} failed")

    @property
    def times(self) -> list[float]:
        return [t for t, _ in self.calls]


def make(clock: FakeClock, fn: Recorder, *, min_interval_s: float = 1.0, max_interval_s: float = 30.0,
         retry_interval_s: float | None = None) -> BoundedFrequencyRunner:
    return BoundedFrequencyRunner(fn, clock=clock, min_interval_s=min_interval_s,
                                  max_interval_s=max_interval_s, retry_interval_s=retry_interval_s)


def test_illegal_transition_raises_naming_state_and_event() -> None:
    """A DUE event while running is illegal and the error names both."""
    with pytest.raises(InvalidTransition, match=r"DUE.*RUNNING"):
        transition(RunnerState.RUNNING, RunnerEvent.DUE)


def test_next_due_is_a_pure_function_of_state_and_times() -> None:
    """next_due gives the min interval for requests, the retry or max interval otherwise."""
    assert next_due(RunnerState.PENDING, TIMING, started_at=0, last_run_end=None) == -math.inf
    assert next_due(RunnerState.PENDING, TIMING, started_at=0, last_run_end=4) == 5
    assert next_due(RunnerState.IDLE, TIMING, started_at=2, last_run_end=None) == 32
    assert next_due(RunnerState.IDLE, TIMING, started_at=0, last_run_end=4) == 34
    assert next_due(RunnerState.RETRY_WAIT, TIMING, started_at=0, last_run_end=4) == 9
    assert next_due(RunnerState.RUNNING, TIMING, started_at=0, last_run_end=4) == math.inf


@pytest.mark.parametrize(("kw", "name"), [
    ({"min_interval_s": 5.0, "max_interval_s": 1.0, "retry_interval_s": 1.0}, "max_interval_s"),
    ({"min_interval_s": -1.0, "max_interval_s": 1.0, "retry_interval_s": 1.0}, "min_interval_s"),
    ({"min_interval_s": 0.0, "max_interval_s": 1.0, "retry_interval_s": 0.0}, "retry_interval_s"),
])
def test_timing_is_validated_eagerly(kw: dict[str, float], name: str) -> None:
    """Impossible intervals raise InvalidArgument naming the argument."""
    with pytest.raises(InvalidArgument, match=name):
        RunnerTiming(**kw)


async def test_first_request_runs_at_once_and_the_next_waits_min_interval() -> None:
    """A request runs immediately the first time; one 0.2 s later waits until 1.0 s."""
    clock = FakeClock()
    fn = Recorder(clock)
    runner = make(clock, fn)
    async with running(runner.run):
        runner.request()
        await clock.run_for(0.2)
        runner.request()
        await clock.run_for(0.7)
        assert fn.times == [0.0]
        await clock.run_for(0.2)
    assert fn.calls == [(0.0, RunReason.REQUESTED), (1.0, RunReason.REQUESTED)]


async def test_burst_of_requests_coalesces_into_one_run() -> None:
    """Ten requests within the min interval make a single run at its end."""
    clock = FakeClock()
    fn = Recorder(clock)
    runner = make(clock, fn)
    async with running(runner.run):
        runner.request()
        await clock.run_for(0.1)
        for _ in range(10):
            runner.request()
            await clock.run_for(0.05)
        await clock.run_for(5)
    assert fn.times == [0.0, 1.0]


async def test_periodic_run_at_max_interval() -> None:
    """Without requests the runner runs every max_interval_s, counted from the last run."""
    clock = FakeClock()
    fn = Recorder(clock)
    runner = make(clock, fn, max_interval_s=10.0)
    async with running(runner.run):
        runner.request()
        await clock.run_for(4)
        runner.request()  # runs at 4.0: the min interval has passed
        await clock.run_for(30)
    assert fn.calls == [(0.0, RunReason.REQUESTED), (4.0, RunReason.REQUESTED),
                        (14.0, RunReason.PERIODIC), (24.0, RunReason.PERIODIC),
                        (34.0, RunReason.PERIODIC)]


async def test_request_during_a_run_runs_again_after_min_interval() -> None:
    """A request made while a 0.5 s run is in progress gives one more run 1 s after it ended."""
    clock = FakeClock()
    fn = Recorder(clock, duration_s=0.5)
    runner = make(clock, fn)
    async with running(runner.run):
        runner.request()
        await clock.run_for(0.25)
        assert runner.state is RunnerState.RUNNING
        runner.request()
        runner.request()
        await clock.run_for(5)
    assert fn.times == [0.0, 1.5]


async def test_failed_run_is_retried_after_retry_interval() -> None:
    """A run that raises is logged and retried retry_interval_s after it ended."""
    clock = FakeClock()
    fn = Recorder(clock, fail_on={1})
    runner = make(clock, fn, retry_interval_s=5.0)
    async with running(runner.run):
        runner.request()
        await clock.run_for(20)
    assert fn.calls[:2] == [(0.0, RunReason.REQUESTED), (5.0, RunReason.RETRY)]
    assert runner.failure_count == 1
    assert runner.state is RunnerState.IDLE


async def test_default_retry_is_the_max_interval_as_kube_proxy() -> None:
    """Without retry_interval_s a failed run is retried after max_interval_s (RetryAfter(syncPeriod))."""
    clock = FakeClock()
    fn = Recorder(clock, fail_on={1, 2})
    runner = make(clock, fn, max_interval_s=30.0)
    async with running(runner.run):
        runner.request()
        await clock.run_for(70)
    assert fn.calls == [(0.0, RunReason.REQUESTED), (30.0, RunReason.RETRY), (60.0, RunReason.RETRY)]


async def test_request_after_failure_triggers_the_retry_sooner() -> None:
    """After a failure, a request runs at the min interval rather than waiting for the retry."""
    clock = FakeClock()
    fn = Recorder(clock, fail_on={1})
    runner = make(clock, fn)
    async with running(runner.run):
        runner.request()
        await clock.run_for(0.5)
        runner.request()
        await clock.run_for(2)
    assert fn.times == [0.0, 1.0]


async def test_invalid_runner_arguments_raise() -> None:
    """min > max raises InvalidArgument at construction."""
    with pytest.raises(InvalidArgument, match="max_interval_s"):
        make(FakeClock(), Recorder(FakeClock()), min_interval_s=10.0, max_interval_s=1.0)


async def test_run_cancelled_mid_sync_is_redone_when_restarted() -> None:
    """Cancelling the loop during a run leaves it PENDING, and a restarted loop runs again at once."""
    clock = FakeClock()
    fn = Recorder(clock, duration_s=5.0)
    runner = make(clock, fn)
    async with running(runner.run):
        runner.request()
        await clock.run_for(1)
        assert runner.state is RunnerState.RUNNING
    assert runner.state is RunnerState.PENDING and runner.run_count == 0
    async with running(runner.run):
        await clock.run_for(6)
    assert fn.times == [0.0, 1.0]
    assert runner.run_count == 1


def test_diagram_is_generated_from_the_table() -> None:
    """Every transition of the table appears in the generated diagram."""
    text = diagram()
    for (src, event), dst in TRANSITIONS.items():
        assert f"{src} --> {dst}: {event}" in text
