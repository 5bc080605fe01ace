"""Partial syncs into the real kernel leave the same ruleset as one full sync (Hypothesis, bounded).

A history of snapshots (Services of the scenario cluster appearing, disappearing and changing
their endpoints) is applied by :class:`~kproxy.modes.nftables.NftablesMode` through ``nft -f`` in
one test namespace: a full sync, then partial ones. After the stale chains have aged (the clock
moves two seconds and one more sync runs), ``nft list table ip kube-proxy`` must equal, up to the
order of chains and of set elements, that of a second namespace that saw only one full sync of
the last snapshot. Examples and steps are bounded (8 examples of at most 4 snapshots).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.kernel.nftables import LinuxNftables
from kproxy.model.names import IPFamily
from kproxy.model.snapshot import Snapshot
from kproxy.modes.nftables import NftablesConfig, NftablesMode, canonical_listing
from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns
from tests.scenarios import CLIENT_GW, NODE, NODE_IP, cluster
from tests.unit.modes.kube import next_snapshot, snapshot_of

pytestmark = pytest.mark.kernel

CONFIG = NftablesConfig(node_ips=(NODE_IP, CLIENT_GW), cluster_cidr=("10.0.0.0/8",),
                        service_cidrs=("172.30.0.0/16",))


def _groups() -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each Service of the scenario cluster with its slice (or None)."""
    docs = cluster()
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for doc in docs:
        if doc["kind"] == "Service":
            out.append((doc, None))
        else:
            out[-1] = (out[-1][0], doc)
    return out


GROUPS = _groups()

#: One state: for each chosen Service, how much of its slice it keeps (all, the first endpoint, none).
states = st.dictionaries(st.integers(0, len(GROUPS) - 1), st.sampled_from(("all", "first", "none")),
                         max_size=6)


def _docs(state: dict[int, str]) -> list[dict[str, Any]]:
    out = []
    for index, keep in sorted(state.items()):
        svc, eps = GROUPS[index]
        out.append(svc)
        if eps is not None and keep != "none":
            eps = dict(eps, endpoints=eps["endpoints"][:1] if keep == "first" else eps["endpoints"])
            out.append(eps)
    return out


async def _listing(mode: NftablesMode) -> dict[str, tuple[str, ...]]:
    return canonical_listing(await mode.kernel.list_ruleset())


def _run_history(name: str, history: list[dict[int, str]]) -> tuple[dict[str, tuple[str, ...]], Snapshot]:
    clock = [10.0]
    mode = NftablesMode(CONFIG, LinuxNftables(IPFamily.IPv4, netns=name), now=lambda: clock[0])
    snap = snapshot_of(_docs(history[0]), hostname=NODE)
    asyncio.run(mode.apply(snap))
    for state in history[1:]:
        clock[0] += 0.25
        snap = next_snapshot(snap, _docs(state), hostname=NODE)
        asyncio.run(mode.apply(snap))
    clock[0] += 2.0
    snap = next_snapshot(snap, _docs(history[-1]), hostname=NODE)
    asyncio.run(mode.apply(snap))
    assert all(r.ok for r in mode.history) and [r.full for r in mode.history].count(True) == 1
    return asyncio.run(_listing(mode)), snap


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(states, min_size=1, max_size=4))
def test_partial_sync_history_equals_one_full_sync(history: list[dict[int, str]]) -> None:
    """After any bounded history of partial syncs, the kernel holds what one full sync writes."""
    require_kernel("nft")
    cleanup_stale()
    with netns("nftpartial") as partial_ns, netns("nftfull") as full_ns:
        partial, last = _run_history(partial_ns, history)
        mode = NftablesMode(CONFIG, LinuxNftables(IPFamily.IPv4, netns=full_ns), now=lambda: 0.0)
        asyncio.run(mode.apply(last))
        assert partial == asyncio.run(_listing(mode))
