"""Partial syncs (KEP-3453) leave the kernel exactly as a full sync would, for any history."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.model import Snapshot
from kproxy.modes.iptables import IptablesRenderer, render_full, render_partial
from tests.unit.modes.iptables.histories import CONFIG, histories
from tests.unit.modes.iptables.restore import apply_noflush


@settings(max_examples=150, deadline=None)
@given(histories())
def test_partial_renders_equal_a_full_render(history: list[Snapshot]) -> None:
    """Full render of the first snapshot plus partial renders of each change == full render of the last."""
    state = apply_noflush({}, render_full(history[0], CONFIG))
    for previous, snapshot in pairwise(history):
        state = apply_noflush(state, render_partial(previous, snapshot, CONFIG))
    assert state == apply_noflush({}, render_full(history[-1], CONFIG))


@settings(max_examples=150, deadline=None)
@given(histories(), st.lists(st.sampled_from(["ok", "ok", "fail", "discard"]), min_size=7, max_size=7))
def test_renderer_recovers_from_failures(history: list[Snapshot], outcomes: list[str]) -> None:
    """With restores failing, or renders dropped unapplied, the renderer still converges."""
    renderer = IptablesRenderer(CONFIG)
    state: dict[str, dict[str, list[str]]] = {}
    for snapshot, outcome in zip(history, outcomes, strict=False):
        result = renderer.render(snapshot)
        if outcome == "fail":
            renderer.failed()
        elif outcome == "ok":
            state = apply_noflush(state, result.text)
            renderer.commit(result)
    if renderer.applied is not history[-1]:
        result = renderer.render(history[-1])
        state = apply_noflush(state, result.text)
        renderer.commit(result)
    assert state == apply_noflush({}, render_full(history[-1], CONFIG))
