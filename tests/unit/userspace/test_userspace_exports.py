"""The userspace package's curated public surface."""

from __future__ import annotations

import kproxy.modes.userspace


def test_every_export_exists_and_is_documented() -> None:
    """Every name in kproxy.modes.userspace.__all__ is importable, and documented."""
    for name in kproxy.modes.userspace.__all__:
        obj = getattr(kproxy.modes.userspace, name)
        if callable(obj):
            assert obj.__doc__, name


def test_exports_are_sorted_and_unique() -> None:
    """__all__ has no duplicates, so the surface is reviewed in one place."""
    names = kproxy.modes.userspace.__all__
    assert len(names) == len(set(names))
