"""Label and field selectors as the API server reads them.

Label selectors: the equality-based subset and existence. Field selectors: ``path=value``,
``path==value`` and ``path!=value`` over dotted paths (``metadata.name``, ``spec.clusterIP``),
comma-separated, as ``fields.ParseSelector``; a missing field reads as ``""``, as the API
server's field sets do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FieldMatcher", "Matcher", "parse_field_selector", "parse_selector"]

Matcher = Callable[[Mapping[str, str]], bool]
FieldMatcher = Callable[[Mapping[str, Any]], bool]


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


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def _field_requirement(text: str) -> FieldMatcher:
    for op in ("!=", "==", "="):
        if op in text:
            path, _, value = (part.strip() for part in text.partition(op))
            if op == "!=":
                return lambda obj: _field(obj, path) != value
            return lambda obj: _field(obj, path) == value
    raise ValueError(f"field selector requirement {text!r}: expected path=value or path!=value")


def parse_field_selector(text: str | None) -> FieldMatcher:
    """A matcher of whole objects for a ``fieldSelector``; empty or missing matches everything.

    Raises:
        ValueError: a requirement without ``=`` or ``!=``.
    """
    if not text:
        return lambda obj: True
    parts = [_field_requirement(p.strip()) for p in text.split(",") if p.strip()]
    return lambda obj: all(p(obj) for p in parts)
