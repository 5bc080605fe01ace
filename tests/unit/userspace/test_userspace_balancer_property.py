"""Property tests of the round-robin balancer under endpoint churn."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.modes.userspace import RoundRobinBalancer

UNIVERSE = tuple(f"10.0.0.{i}:80" for i in range(1, 7))

#: One step: ``None`` is a pick, a frozenset is a new endpoint set (possibly empty).
_Step = frozenset[str] | None


def churns(*, min_size: int = 1, max_size: int = 80) -> st.SearchStrategy[list[_Step]]:
    """Interleavings of picks and endpoint-set changes over UNIVERSE, biased toward picks."""
    sets = st.frozensets(st.sampled_from(UNIVERSE), max_size=len(UNIVERSE))
    return st.lists(st.one_of(st.none(), st.none(), sets), min_size=min_size, max_size=max_size)


@settings(max_examples=300, deadline=None)
@given(steps=churns(), seed=st.none() | st.integers(0, 2**32 - 1), initial=st.sets(st.sampled_from(UNIVERSE)))
def test_no_endpoint_present_throughout_a_window_is_starved(
    steps: list[_Step], seed: int | None, initial: set[str]
) -> None:
    """In any n consecutive picks (n = endpoints in the universe), one present at each of them is picked."""
    lb = RoundRobinBalancer(initial, rng=None if seed is None else random.Random(seed))
    picks: list[tuple[frozenset[str], str]] = []  # (endpoints at the pick, chosen)
    for step in steps:
        if step is not None:
            lb.update(step)
        elif lb.endpoints:
            present = frozenset(lb.endpoints)
            chosen = lb.next_endpoint("192.0.2.1", 0.0)
            assert chosen in present
            picks.append((present, chosen))
    n = len(UNIVERSE)
    for start in range(len(picks) - n + 1):
        window = picks[start:start + n]
        always = {ep for ep in UNIVERSE if all(ep in present for present, _ in window)}
        picked = {c for _, c in window}
        assert always <= picked, (start, window)
