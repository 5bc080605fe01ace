"""Partial syncs leave the same rules as one full sync, on the emulated kernel and on Linux
(bounded Hypothesis).

For each history of snapshots (:func:`tests.unit.modes.iptables.histories.histories`), one
kernel is synced through :class:`~kproxy.modes.iptables.mode.IptablesMode` (full at start,
partial after, ``iptables-restore --noflush``), another gets a single full sync of the last
snapshot; their saves, canonically sorted, must be equal. The kernels are
:class:`~kproxy.kernel.EmulatedNetfilter` over two fresh emulated nodes, or
:class:`~kproxy.kernel.LinuxNetfilter` in two namespaces made for the example (deleted after).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, given, settings

from emulation import ManualClock
from emulation.netfilter import Netns, Ruleset
from kproxy.kernel import EmulatedNetfilter, LinuxNetfilter, NetfilterKernel
from kproxy.model import Snapshot
from kproxy.modes.iptables import IptablesRenderer
from kproxy.modes.iptables.mode import IptablesMode, program
from tests.kernel.conftest import Executor
from tests.kernel.netns import cleanup_stale, netns
from tests.scenarios import node_model
from tests.unit.modes.iptables.histories import CONFIG, histories

KERNEL_TOOLS = ("iptables-restore", "iptables-save", "iptables")


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



@contextmanager
def _two_kernels(executor: Executor) -> Iterator[tuple[NetfilterKernel, NetfilterKernel]]:
    """Two empty kernels of the executor."""
    if executor is Executor.EMULATED:
        yield (EmulatedNetfilter(Netns(node_model(), ManualClock(), ruleset=Ruleset(4))),
               EmulatedNetfilter(Netns(node_model(), ManualClock(), ruleset=Ruleset(4))))  # fmt: skip
        return
    cleanup_stale()
    with netns("partial") as a, netns("full") as b:
        yield LinuxNetfilter(netns=a), LinuxNetfilter(netns=b)


async def _save(kernel: NetfilterKernel) -> str:
    """The kernel's rules as ``iptables-save`` prints them (the emulated save is synchronous)."""
    if isinstance(kernel, EmulatedNetfilter):
        return kernel.save()
    assert isinstance(kernel, LinuxNetfilter)
    return await kernel.save()


async def _partial(kernel: NetfilterKernel, history: list[Snapshot]) -> str:
    mode = IptablesMode(CONFIG, kernel, now=lambda: 0.0)
    for snapshot in history:
        await mode.apply(snapshot)
    assert [r.full for r in mode.history] == [True] + [False] * (len(history) - 1)
    return await _save(kernel)


async def _full(kernel: NetfilterKernel, snapshot: Snapshot) -> str:
    await program(kernel, IptablesRenderer(CONFIG).render(snapshot, full=True))
    return await _save(kernel)


@settings(max_examples=10, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(history=histories())
def test_partial_syncs_equal_a_full_sync(executor: Executor, history: list[Snapshot]) -> None:
    """The save after a full sync and partial syncs equals the save after one full sync."""
    with _two_kernels(executor) as (partial, full):
        got = asyncio.run(_partial(partial, history))
        want = asyncio.run(_full(full, history[-1]))
    assert _canonical(got) == _canonical(want)
