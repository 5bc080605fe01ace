"""The collector pause around large builds: off inside (nested too), restored after, survivors frozen."""

from __future__ import annotations

import gc
import sys

from kproxy.sources._gcpause import PAUSED_SWITCH_INTERVAL_S, collector_paused


def test_the_collector_is_off_inside_and_restored_after_nesting() -> None:
    """Inside (and inside a nested pause) gc is disabled with a short switch interval; after, as before."""
    before = sys.getswitchinterval()
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        assert sys.getswitchinterval() <= PAUSED_SWITCH_INTERVAL_S + 1e-9
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
        kept = [[i] for i in range(1000)]
    assert gc.isenabled()
    assert sys.getswitchinterval() == before
    assert gc.get_freeze_count() >= len(kept)  # the survivors left the collected generations
    gc.unfreeze()
