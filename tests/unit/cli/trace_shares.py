"""What the older trace tests compare: each endpoint's address and probability only (issue 17
added each endpoint's ``trace`` and ``source`` beside them)."""

from __future__ import annotations

from typing import Any

__all__ = ["address_shares"]


def address_shares(endpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``[{"address", "probability"}]`` of a trace's JSON ``endpoints``."""
    return [{"address": e["address"], "probability": e["probability"]} for e in endpoints]
