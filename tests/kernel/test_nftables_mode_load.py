"""The nftables mode's transactions load into the real kernel with nft 1.0.6's ``nft -f``.

Each test creates its own network namespace. The rendered transaction (kube-proxy's
TestOverallNFTablesRules cluster, IPv4 and IPv6) loads; a second full sync over the first loads
too (the base chains are recreated once, then flushed and refilled); the kernel's listing holds
exactly the chains and sets the renderer wrote; a refused transaction changes nothing and the
error names the failing line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kproxy.errors import KernelError
from kproxy.kernel.nftables import LinuxNftables, table_objects
from kproxy.model.names import IPFamily
from kproxy.modes.nftables import NftablesConfig, NftablesMode, canonical_listing, render_transaction
from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns
from tests.unit.modes.kube import endpoint_slice, ep, next_snapshot, port, service, snapshot_of
from tests.unit.modes.nftables.dump import Dump
from tests.unit.modes.nftables.test_rulesets import overall_cluster

pytestmark = pytest.mark.kernel

FAKE = NftablesConfig.kube_proxy_test_fake()


@pytest.fixture
def ns() -> Iterator[str]:
    require_kernel("nft")
    cleanup_stale()
    with netns("nftload") as name:
        yield name


def test_overall_transaction_loads_and_lists_what_was_written(ns: str) -> None:
    """TestOverallNFTablesRules' transaction loads; the kernel lists exactly its chains and sets."""
    text = render_transaction(snapshot_of(overall_cluster()), FAKE)
    kernel = LinuxNftables(IPFamily.IPv4, netns=ns)
    asyncio.run(kernel.run(text))
    chains, sets = table_objects(asyncio.run(kernel.list_ruleset()))
    state = Dump()
    state.apply(text)
    assert chains == set(state.chains)
    assert sets == set(state.sets)


def test_second_full_sync_loads_over_the_first(ns: str) -> None:
    """A restarted proxier's first full sync (base chains deleted and recreated) loads over a live table."""
    text = render_transaction(snapshot_of(overall_cluster()), FAKE)
    kernel = LinuxNftables(IPFamily.IPv4, netns=ns)
    asyncio.run(kernel.run(text))
    before = canonical_listing(asyncio.run(kernel.list_ruleset()))
    asyncio.run(kernel.run(text))
    assert canonical_listing(asyncio.run(kernel.list_ruleset())) == before


def test_ipv6_transaction_loads(ns: str) -> None:
    """The ip6 table of a dual-stack cluster loads (bracketed DNAT targets, ip6 matches)."""
    docs = [service("ns1", "svc1", "fd00:172:30::41", [port("p80", 80, nodePort=3001)],
                    type="LoadBalancer", ipFamilies=["IPv6"], ingress=["2001:db8:5::1"],
                    loadBalancerSourceRanges=["2001:db8:7::/64"], sessionAffinity="ClientIP"),
            endpoint_slice("ns1", "svc1", [ep("fd00:10:180::1"), ep("fd00:10:180::2", "test-node")],
                           [("p80", 80, "TCP")], family="IPv6")]
    text = render_transaction(snapshot_of(docs), FAKE.for_family(IPFamily.IPv6))
    kernel = LinuxNftables(IPFamily.IPv6, netns=ns)
    asyncio.run(kernel.run(text))
    listing = asyncio.run(kernel.list_ruleset())
    assert "dnat to [fd00:10:180::1]:80" in listing
    assert "table ip6 kube-proxy" in listing


def test_refused_transaction_changes_nothing_and_names_the_line(ns: str) -> None:
    """nft refuses a bad line atomically; KernelError quotes it."""
    kernel = LinuxNftables(IPFamily.IPv4, netns=ns)
    asyncio.run(kernel.run(render_transaction(snapshot_of([]), FAKE)))
    before = asyncio.run(kernel.list_ruleset())
    bad = "add chain ip kube-proxy extra\nadd rule ip kube-proxy extra jump no-such-chain\n"
    with pytest.raises(KernelError, match="failing line: add rule ip kube-proxy extra jump no-such-chain"):
        asyncio.run(kernel.run(bad))
    assert asyncio.run(kernel.list_ruleset()) == before


def test_mode_syncs_partially_into_the_kernel(ns: str) -> None:
    """NftablesMode: a full sync, then a partial one adding a Service, both accepted by the kernel."""
    kernel = LinuxNftables(IPFamily.IPv4, netns=ns)
    clock = [0.0]
    mode = NftablesMode(FAKE, kernel, now=lambda: clock[0])
    docs = overall_cluster()
    first = snapshot_of(docs[:3])
    asyncio.run(mode.apply(first))
    asyncio.run(mode.apply(next_snapshot(first, docs)))
    assert [r.full for r in mode.history] == [True, False] and all(r.ok for r in mode.history)
    chains, _ = table_objects(asyncio.run(kernel.list_ruleset()))
    assert "firewall-HVFWP5L3-ns5/svc5/tcp/p80" in chains
    assert not mode.renderer.needs_full
