"""The manual clock: it starts at a finite time and moves only forward, by finite amounts."""

from __future__ import annotations

import math

import pytest

from emulation.clock import ManualClock


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -1.0])
def test_the_manual_clock_moves_only_forward_by_a_finite_amount(seconds: float) -> None:
    """``advance`` refuses NaN, infinity and going back, and leaves the time as it was."""
    clock = ManualClock()
    with pytest.raises(ValueError):
        clock.advance(seconds)
    assert clock.now() == 0.0


def test_a_clock_cannot_start_at_nan_or_infinity() -> None:
    """A clock starting at NaN or infinity, or advanced by a bool, is refused."""
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError):
            ManualClock(bad)
    with pytest.raises(ValueError):
        ManualClock().advance(True)
