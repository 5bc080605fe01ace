# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""The iptables mode as a consumer: full then partial syncs, recovery after failure, periodic full sync."""

from __future__ import annotations

import asyncio

import pytest

from emulation import ManualClock
from emulation.netfilter import Netns, Ruleset
from kproxy.errors import InvalidArgument, KernelError
from kproxy.kernel import EmulatedNetfilter
from kproxy.model import IPFamily
from kproxy.modes.iptables import IptablesConfig
from kproxy.modes.iptables.mode import FULL_SYNC_PERIOD_S, IptablesMode
from tests.scenarios import NODE, cluster, node_model
from tests.unit.modes.kube import endpoint_slice, ep, next_snapshot, snapshot_of

CONFIG = IptablesConfig(node_ips=("192.168.0.2",), cluster_cidr=("10.0.0.0/8",))


class FlakyKernel(EmulatedNetfilter):
    """An emulated kernel that refuses the next ``fail`` applies."""

    fail = 0

    async def restore(self, text: str, *, noflush: bool = True, counters: bool = True) -> None:
        if self.fail:
            self.fail -= 1
            raise KernelError("injected failure")
        await super().restore(text, noflush=noflush, counters=counters)


class Clock:
    """Seconds that move when told."""

    t = 0.0

    def now(self) -> float:
        return self.t


def _mode(clock: Clock | None = None) -> tuple[IptablesMode, FlakyKernel]:
    kernel = FlakyKernel(Netns(node_model(), ManualClock(), ruleset=Ruleset(4)))
    return IptablesMode(CONFIG, kernel, now=(clock or Clock()).now), kernel


def _history() -> list:
    docs = cluster()
    first = snapshot_of(docs, hostname=NODE)
    changed = [*docs, endpoint_slice("ns1", "svc1", [ep("10.180.0.9", NODE)], [("p80", 8080, "TCP")], suffix="2")]
    return [first, next_snapshot(first, changed, hostname=NODE)]


def test_first_sync_is_full_and_the_next_partial() -> None:
    """Start: full; then only the changed Service's chains are written."""
    mode, _kernel = _mode()
    first, second = _history()
    asyncio.run(mode.apply(first))
    asyncio.run(mode.apply(second))
    assert [r.full for r in mode.history] == [True, False]
    assert mode.history[1].result.written_ports == 2  # svc1's two ports


def test_partial_syncs_leave_the_kernel_as_a_full_sync_would() -> None:
    """The emulated kernel after full + partial equals a fresh full sync of the last snapshot."""
    mode, kernel = _mode()
    first, second = _history()
    asyncio.run(mode.apply(first))
    asyncio.run(mode.apply(second))
    fresh, other = _mode()
    asyncio.run(fresh.apply(second))
    assert kernel.save() == other.save()


def test_a_failure_makes_the_next_sync_full() -> None:
    """After the kernel refuses a sync, the error propagates and the retry is full."""
    mode, kernel = _mode()
    first, second = _history()
    asyncio.run(mode.apply(first))
    kernel.fail = 1
    with pytest.raises(KernelError):
        asyncio.run(mode.apply(second))
    assert mode.needs_full
    asyncio.run(mode.apply(second))
    assert [(r.full, r.ok) for r in mode.history] == [(True, True), (False, False), (True, True)]


def test_a_full_sync_happens_every_full_sync_period() -> None:
    """A sync more than an hour after the last full one is full again."""
    clock = Clock()
    mode, _ = _mode(clock)
    first, second = _history()
    asyncio.run(mode.apply(first))
    clock.t = FULL_SYNC_PERIOD_S / 2
    asyncio.run(mode.apply(second))
    clock.t = FULL_SYNC_PERIOD_S + 1
    asyncio.run(mode.apply(second))
    assert [r.full for r in mode.history] == [True, False, True]


def test_request_full() -> None:
    """request_full() makes the next sync full."""
    mode, _ = _mode()
    first, _second = _history()
    asyncio.run(mode.apply(first))
    mode.request_full()
    asyncio.run(mode.apply(first))
    assert [r.full for r in mode.history] == [True, True]


def test_family_mismatch_is_refused() -> None:
    """An IPv6 config cannot drive an IPv4 kernel."""
    kernel = EmulatedNetfilter(Netns(node_model(), ManualClock()))
    with pytest.raises(InvalidArgument, match="IPv6"):
        IptablesMode(CONFIG.for_family(IPFamily.IPv6), kernel, now=lambda: 0.0)
