"""The userspace package's curated public surface."""

from __future__ import annotations

import kproxy.userspace


def test_every_export_exists_and_is_documented() -> None:
    """Every name in kproxy.userspace.__all__ is importable, and its classes and functions have docstrings."""
    for name in kproxy.userspace.__all__:
        obj = getattr(kproxy.userspace, name)
        if callable(obj):
            assert obj.__doc__, name


def test_exports_are_sorted_and_unique() -> None:
    """__all__ has no duplicates, so the surface is reviewed in one place."""
    names = kproxy.userspace.__all__
    assert len(names) == len(set(names))
