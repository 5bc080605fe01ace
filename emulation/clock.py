"""Injected time for the kernel models: a ``Clock`` protocol and a manual clock for tests."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Clock", "ManualClock"]


class Clock(Protocol):
    """Anything with ``now() -> float`` seconds (monotonic; the origin does not matter)."""

    def now(self) -> float: ...


@dataclass(slots=True)
class ManualClock:
    """A clock that moves only when told to: ``advance(seconds)``."""

    time_s: float = 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.time_s):
            raise ValueError(f"a clock starts at a finite time: time_s={self.time_s}")

    def now(self) -> float:
        """The current time in seconds."""
        return self.time_s

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (a finite number, not negative).

        Raises:
            ValueError: ``seconds`` is negative, infinite or NaN.
        """
        if isinstance(seconds, bool) or not math.isfinite(seconds):
            raise ValueError(f"time can only advance by a finite number of seconds: {seconds=}")
        if seconds < 0:
            raise ValueError(f"time cannot go backwards: {seconds=}")
        self.time_s += seconds
