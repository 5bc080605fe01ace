"""The sync engine: change tracker, bounded-frequency runner (injected clock) and their wiring."""

from kproxy.clock import Clock, FakeClock, MonotonicClock, settle
from kproxy.sync.engine import Consumer, SyncEngine
from kproxy.sync.runner import (
    BoundedFrequencyRunner,
    RunnerEvent,
    RunnerState,
    RunnerTiming,
    RunReason,
    diagram,
    next_due,
)
from kproxy.sync.tracker import ChangeTracker, PendingChange, changed_names

__all__ = [
    "BoundedFrequencyRunner",
    "ChangeTracker",
    "Clock",
    "Consumer",
    "FakeClock",
    "MonotonicClock",
    "PendingChange",
    "RunReason",
    "RunnerEvent",
    "RunnerState",
    "RunnerTiming",
    "SyncEngine",
    "changed_names",
    "diagram",
    "next_due",
    "settle",
]
