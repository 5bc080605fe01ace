"""Go durations, as kube-proxy's flags take them (``1s``, ``500ms``, ``1m30s``).

The grammar is Go's ``time.ParseDuration``: an optional sign, then one or more decimal numbers
each with a unit (``ns``, ``us``/``µs``/``μs``, ``ms``, ``s``, ``m``, ``h``); ``0`` alone needs
no unit. A duration beyond Go's int64 nanoseconds (about 292 years) overflows.
"""

from __future__ import annotations

import re

from kproxy.errors import ConfigError

__all__ = ["parse_duration"]

_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000,
            "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|µs|μs|ms|s|m|h)")
_MAX_NS = 2**63 - 1


def parse_duration(text: str, *, flag: str = "duration") -> float:
    """Parse a Go ``time.ParseDuration`` string into seconds.

    Args:
        text: e.g. ``"1s"``, ``"250ms"``, ``"1m30s"``, ``"0"``, ``"+1.5h"``.
        flag: the flag name, for the error message.

    Returns:
        The duration in seconds (float, >= 0).

    Raises:
        ConfigError: not a Go duration, negative, or beyond Go's range.
    """
    raw = text.strip()
    body = raw[1:] if raw[:1] in "+-" else raw
    if body == "0":
        return 0.0
    total_ns = 0.0
    pos = 0
    while pos < len(body):
        match = _PART.match(body, pos)
        if match is None or not (match.group(1) or match.group(2)):
            raise ConfigError(
                f"{flag}: {text!r} is not a duration; use a Go duration such as 1s, 250ms or 1m30s")
        whole, frac, unit = match.group(1) or "0", match.group(2) or "", match.group(3)
        total_ns += (int(whole) + (int(frac) / 10 ** len(frac) if frac else 0.0)) * _UNIT_NS[unit]
        pos = match.end()
    if not body:
        raise ConfigError(f"{flag}: empty duration; use a Go duration such as 1s or 250ms")
    if total_ns > _MAX_NS:
        raise ConfigError(f"{flag}: {text!r} overflows Go's duration range (about 292 years)")
    if raw.startswith("-") and total_ns:
        raise ConfigError(f"{flag}: expected a duration >= 0, got {text!r}")
    return total_ns / 1e9
