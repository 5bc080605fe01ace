"""The top-level package exports exactly its documented public API."""

from __future__ import annotations

import kproxy


def test_every_exported_name_exists() -> None:
    """Each name in kproxy.__all__ is importable from kproxy."""
    missing = [name for name in kproxy.__all__ if not hasattr(kproxy, name)]
    assert not missing


def test_exported_callables_have_docstrings() -> None:
    """Every exported class and function documents its contract."""
    undocumented = [name for name in kproxy.__all__
                    if callable(getattr(kproxy, name)) and not getattr(kproxy, name).__doc__]
    assert not undocumented


def test_exports_are_sorted_and_unique() -> None:
    """__all__ is sorted (case-sensitively) and has no duplicates."""
    assert list(kproxy.__all__) == sorted(set(kproxy.__all__))
