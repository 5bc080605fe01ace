"""Go-style durations, as kube-proxy's flags take them (``1s``, ``500ms``, ``1m30s``)."""

from __future__ import annotations

import re

from kproxy.errors import ConfigError

__all__ = ["parse_duration"]

_UNITS_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")


def parse_duration(text: str, *, flag: str = "duration") -> float:
    """Parse a Go ``time.ParseDuration`` string (or a bare number of seconds) into seconds.

    Args:
        text: e.g. ``"1s"``, ``"250ms"``, ``"1m30s"``, ``"0"``, ``"2.5"``.
        flag: the flag name, for the error message.

    Returns:
        The duration in seconds (float, >= 0).

    Raises:
        ConfigError: the text is not a non-negative duration.
    """
    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        pass
    else:
        if value < 0:
            raise ConfigError(f"{flag}: expected a duration >= 0, got {text!r}")
        return value
    pos, total = 0, 0.0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_S[match.group(2)]
        pos = match.end()
    if pos != len(raw) or not raw:
        raise ConfigError(
            f"{flag}: {text!r} is not a duration; use a Go duration such as 1s, 250ms or 1m30s"
        )
    return total
