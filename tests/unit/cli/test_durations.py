"""Go-style duration flags, as kube-proxy's --min-sync-period and --sync-period take them."""

from __future__ import annotations

import pytest

from kproxy.config.durations import parse_duration
from kproxy.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("250ms", 0.25), ("1m30s", 90.0), ("1h", 3600.0), ("0", 0.0), ("+1s", 1.0),
     ("1.5s", 1.5), ("0s", 0.0), ("100us", 1e-4), ("100µs", 1e-4), (".5s", 0.5), ("1h2m3s4ms", 3723.004)],
)
def test_parses_go_durations(text: str, seconds: float) -> None:
    """Each Go duration spelling gives its value in seconds."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "1x", "s", "-1s", "1s2", "one second", "1 s", "1", "2.5", "1e2", "1_0s", "inf", "nan",
             "99999999h", ".s", "+"])
def test_rejects_what_go_rejects(text: str) -> None:
    """A malformed duration is a ConfigError naming the flag."""
    with pytest.raises(ConfigError, match="--sync-period"):
        parse_duration(text, flag="--sync-period")
