"""Label selectors as the API server reads them (the equality-based subset and existence)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

__all__ = ["parse_selector"]

Matcher = Callable[[Mapping[str, str]], bool]


def _requirement(text: str) -> Matcher:
    text = text.strip()
    if text.startswith("!"):
        key = text[1:].strip()
        return lambda labels: key not in labels
    for op in ("!=", "==", "="):
        if op in text:
            key, _, value = (part.strip() for part in text.partition(op))
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    key = text
    return lambda labels: key in labels


def parse_selector(text: str | None) -> Matcher:
    """A matcher for ``key``, ``!key``, ``key=value``, ``key==value`` and ``key!=value``, comma-separated.

    An empty or missing selector matches everything.
    """
    if not text:
        return lambda labels: True
    parts = [_requirement(p) for p in text.split(",") if p.strip()]
    return lambda labels: all(p(labels) for p in parts)
