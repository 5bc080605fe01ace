"""Partial syncs in a real namespace leave the same rules as one full sync (bounded Hypothesis).

For each history of snapshots (``tests.unit.modes.iptables.test_partial.histories``), one
namespace is synced through :class:`~kproxy.modes.iptables.mode.IptablesMode` with a
:class:`~kproxy.kernel.LinuxNetfilter` (full at start, partial after, ``iptables-restore
--noflush``), another gets a single full sync of the last snapshot; their ``iptables-save``
outputs, canonically sorted, must be equal.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings

from kproxy.kernel import LinuxNetfilter
from kproxy.model import Snapshot
from kproxy.modes.iptables import IptablesRenderer
from kproxy.modes.iptables.mode import IptablesMode, program
from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns
from tests.unit.modes.iptables.test_partial import CONFIG, histories

pytestmark = pytest.mark.kernel


def _canonical(text: str) -> dict[str, dict[str, tuple[str, ...]]]:
    """``{table: {chain: rules}}``: chains in any order, each chain's rules in order."""
    out: dict[str, dict[str, list[str]]] = {}
    table: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("*"):
            table = out.setdefault(line[1:], {})
        elif line.startswith(":"):
            table.setdefault(line[1:].split()[0], [])
        elif line.startswith("-A "):
            table.setdefault(line.split()[1], []).append(line)
    return {t: {c: tuple(r) for c, r in chains.items()} for t, chains in out.items()}


async def _partial(ns: str, history: list[Snapshot]) -> str:
    kernel = LinuxNetfilter(netns=ns)
    mode = IptablesMode(CONFIG, kernel, now=lambda: 0.0)
    for snapshot in history:
        await mode.apply(snapshot)
    assert [r.full for r in mode.history] == [True] + [False] * (len(history) - 1)
    return await kernel.save()


async def _full(ns: str, snapshot: Snapshot) -> str:
    kernel = LinuxNetfilter(netns=ns)
    await program(kernel, IptablesRenderer(CONFIG).render(snapshot, full=True))
    return await kernel.save()


def test_setup() -> None:
    """The machine can run the partial-sync property (root, iptables-restore)."""
    require_kernel("iptables-restore", "iptables-save", "iptables")
    cleanup_stale()


@settings(max_examples=10, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(histories())
def test_partial_syncs_equal_a_full_sync_in_the_kernel(history: list[Snapshot]) -> None:
    """iptables-save after a full sync and partial syncs equals iptables-save after one full sync."""
    require_kernel("iptables-restore", "iptables-save", "iptables")
    with netns("partial") as a, netns("full") as b:
        got = asyncio.run(_partial(a, history))
        want = asyncio.run(_full(b, history[-1]))
    assert _canonical(got) == _canonical(want)
