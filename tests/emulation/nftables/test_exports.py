"""emulation.nftables exports exactly its documented public API, which kproxy's nftables mode uses."""

from __future__ import annotations

import inspect

import emulation.nftables as nft


def test_every_exported_name_exists_and_is_documented() -> None:
    """Each name in __all__ is importable, and each class and function has a docstring."""
    assert [n for n in nft.__all__ if not hasattr(nft, n)] == []
    assert [n for n in nft.__all__ if callable(getattr(nft, n)) and not getattr(nft, n).__doc__] == []


def test_exports_are_sorted_and_unique() -> None:
    """__all__ is sorted and has no duplicates."""
    assert list(nft.__all__) == sorted(set(nft.__all__))


def test_the_stable_entry_points_keep_their_shape() -> None:
    """The entry points keep their documented parameters (load, apply, list_ruleset, Netns.send/enumerate)."""
    assert list(inspect.signature(nft.load).parameters)[:1] == ["text"]
    assert list(inspect.signature(nft.apply).parameters)[:2] == ["ruleset", "text"]
    assert list(inspect.signature(nft.list_ruleset).parameters)[:1] == ["ruleset"]
    assert list(inspect.signature(nft.Netns.send).parameters)[1:3] == ["packet", "rng"]
    assert list(inspect.signature(nft.Netns.enumerate).parameters)[1:2] == ["packet"]
