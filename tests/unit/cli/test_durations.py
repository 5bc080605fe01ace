"""Go-style duration flags, as kube-proxy's --min-sync-period and --sync-period take them."""

from __future__ import annotations

import pytest

from kproxy.cli.durations import parse_duration
from kproxy.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("250ms", 0.25), ("1m30s", 90.0), ("1h", 3600.0), ("0", 0.0), ("2.5", 2.5),
     ("1.5s", 1.5), ("0s", 0.0), ("100us", 1e-4)],
)
def test_parses_go_durations(text: str, seconds: float) -> None:
    """Each Go duration spelling gives its value in seconds."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1x", "s", "-1", "1s2", "one second", "1 s"])
def test_rejects_what_go_rejects(text: str) -> None:
    """A malformed duration is a ConfigError naming the flag."""
    with pytest.raises(ConfigError, match="--sync-period"):
        parse_duration(text, flag="--sync-period")
