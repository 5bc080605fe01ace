# ruff: noqa: E501  (kube-proxy's expected rulesets are kept line for line)
"""Partial syncs as kube-proxy's TestSyncProxyRulesRepeated drives them: the state and the size of
each transaction, stale chains flushed and deleted a second later, full syncs after a failure."""

from __future__ import annotations

from typing import Any

from kproxy.model.snapshot import Snapshot
from kproxy.modes.nftables import NftablesConfig, NftablesRenderer, RenderResult, sort_transaction
from tests.unit.modes.kube import endpoint_slice, ep, next_snapshot, port, service, snapshot_of
from tests.unit.modes.nftables.dump import Dump
from tests.unit.modes.nftables.expected import BASE_RULES, SVC1, SVC2, SVC3

FAKE = NftablesConfig.kube_proxy_test_fake()

SVC3_TWO = """
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 ip daddr 172.30.0.43 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-SWWHDC7X-ns3/svc3/tcp/p80__10.0.3.2/80 , 1 : goto endpoint-TQ2QKHCZ-ns3/svc3/tcp/p80__10.0.3.3/80 }
add chain ip kube-proxy endpoint-SWWHDC7X-ns3/svc3/tcp/p80__10.0.3.2/80
add rule ip kube-proxy endpoint-SWWHDC7X-ns3/svc3/tcp/p80__10.0.3.2/80 ip saddr 10.0.3.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SWWHDC7X-ns3/svc3/tcp/p80__10.0.3.2/80 meta l4proto tcp dnat to 10.0.3.2:80
add chain ip kube-proxy endpoint-TQ2QKHCZ-ns3/svc3/tcp/p80__10.0.3.3/80
add rule ip kube-proxy endpoint-TQ2QKHCZ-ns3/svc3/tcp/p80__10.0.3.3/80 ip saddr 10.0.3.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-TQ2QKHCZ-ns3/svc3/tcp/p80__10.0.3.3/80 meta l4proto tcp dnat to 10.0.3.3:80
add element ip kube-proxy cluster-ips { 172.30.0.43 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
"""


class Node:
    """One renderer and the fake kernel it programs, synced as kube-proxy's ``syncProxyRules``."""

    def __init__(self, *, listing: bool = True) -> None:
        self.listing = listing
        self.renderer = NftablesRenderer(FAKE)
        self.kernel = Dump()
        self.now_s = 100.0
        self.last: RenderResult | None = None

    def sync(self, snapshot: Snapshot) -> RenderResult:
        if self.listing:
            chains, sets = set(self.kernel.chains), set(self.kernel.sets)
            result = self.renderer.render(snapshot, existing_chains=chains, existing_sets=sets, now_s=self.now_s)
        else:
            result = self.renderer.render(snapshot, now_s=self.now_s)
        self.kernel.apply(result.cleanup)
        self.kernel.apply(result.text)
        self.renderer.commit(result)
        self.last = result
        return result

    def state(self) -> str:
        return sort_transaction(self.kernel.text())


def _svc(ns: str, name: str, ip: str, pname: str, number: int) -> dict[str, Any]:
    return service(ns, name, ip, [port(pname, number)])


def _eps(ns: str, name: str, pname: str, number: int, *ips: str) -> dict[str, Any]:
    return endpoint_slice(ns, name, [ep(ip) for ip in ips], [(pname, number, "TCP")])


def test_repeated_syncs_follow_kube_proxy() -> None:
    """TestSyncProxyRulesRepeated: each sync's state and operation count equal kube-proxy's."""
    node = Node()
    svc1, svc2 = _svc("ns1", "svc1", "172.30.0.41", "p80", 80), _svc("ns2", "svc2", "172.30.0.42", "p8080", 8080)
    eps1, eps2 = _eps("ns1", "svc1", "p80", 80, "10.0.1.1"), _eps("ns2", "svc2", "p8080", 8080, "10.0.2.1")
    svc3, eps3 = _svc("ns3", "svc3", "172.30.0.43", "p80", 80), _eps("ns3", "svc3", "p80", 80, "10.0.3.1")
    snap = snapshot_of([svc1, svc2, eps1, eps2])
    assert node.sync(snap).full
    assert node.state() == sort_transaction(BASE_RULES + SVC1 + SVC2)

    snap = next_snapshot(snap, [svc1, svc2, eps1, eps2, svc3, eps3])
    result = node.sync(snap)
    assert not result.full and result.operations == 10
    assert node.state() == sort_transaction(BASE_RULES + SVC1 + SVC2 + SVC3)

    snap = next_snapshot(snap, [svc1, eps1, eps2, svc3, eps3])
    result = node.sync(snap)
    assert result.operations == 4
    svc2_flushed = """
add chain ip kube-proxy service-MHHHYRWA-ns2/svc2/tcp/p8080
add chain ip kube-proxy endpoint-7RVP4LUQ-ns2/svc2/tcp/p8080__10.0.2.1/8080
"""
    assert node.state() == sort_transaction(BASE_RULES + SVC1 + svc2_flushed + SVC3)

    node.now_s += 2.0
    result = node.sync(snap)
    assert result.operations == 0 and len(result.deleted_chains) == 2
    assert node.state() == sort_transaction(BASE_RULES + SVC1 + SVC3)

    svc4 = _svc("ns4", "svc4", "172.30.0.44", "p80", 80)
    snap = next_snapshot(snap, [svc1, eps1, eps2, svc3, eps3, svc4])
    result = node.sync(snap)
    assert result.operations == 2
    assert 'add element ip kube-proxy no-endpoint-services { 172.30.0.44 . tcp . 80 comment "ns4/svc4:p80" : goto reject-chain }' in node.kernel.text()

    eps4 = _eps("ns4", "svc4", "p80", 80, "10.0.4.1")
    snap = next_snapshot(snap, [svc1, eps1, eps2, svc3, eps3, svc4, eps4])
    assert node.sync(snap).operations == 10

    eps3b = _eps("ns3", "svc3", "p80", 80, "10.0.3.2")
    snap = next_snapshot(snap, [svc1, eps1, eps2, svc3, eps3b, svc4, eps4])
    result = node.sync(snap)
    assert result.operations == 9
    assert "endpoint-2OCDJSZQ-ns3/svc3/tcp/p80__10.0.3.1/80" in result.stale_chains

    node.now_s += 2.0
    eps3c = _eps("ns3", "svc3", "p80", 80, "10.0.3.2", "10.0.3.3")
    snap = next_snapshot(snap, [svc1, eps1, eps2, svc3, eps3c, svc4, eps4])
    result = node.sync(snap)
    assert result.operations == 12
    assert result.deleted_chains == ("endpoint-2OCDJSZQ-ns3/svc3/tcp/p80__10.0.3.1/80",)
    assert SVC3_TWO.strip().splitlines()[2] in node.kernel.text()

    eps3_empty = _eps("ns3", "svc3", "p80", 80)
    snap = next_snapshot(snap, [svc1, eps1, eps2, svc3, eps3_empty, svc4, eps4])
    result = node.sync(snap)
    assert result.operations == 5
    assert result.stale_chains == {"service-4AT6LBPK-ns3/svc3/tcp/p80",
                                   "endpoint-SWWHDC7X-ns3/svc3/tcp/p80__10.0.3.2/80",
                                   "endpoint-TQ2QKHCZ-ns3/svc3/tcp/p80__10.0.3.3/80"}

    snap = next_snapshot(snap, [svc1, eps1, eps2, svc3, eps3c, svc4, eps4])
    result = node.sync(snap)
    assert result.operations == 14 and not result.stale_chains
    restored = node.state()

    snap = next_snapshot(snap, [svc1, eps1, eps2, svc3, eps3_empty, svc4, eps4])
    node.sync(snap)
    node.now_s += 2.0
    snap = next_snapshot(snap, [svc1, eps1, eps2, svc3, eps3c, svc4, eps4])
    node.sync(snap)
    assert node.state() == restored
    snap = next_snapshot(snap, [svc1, eps1, eps2, svc3, eps3c, svc4, eps4])
    assert node.sync(snap).operations == 0
    assert node.state() == restored


def test_stale_chain_waits_a_second_after_its_last_flush() -> None:
    """A stale chain is deleted only by a sync starting more than 1 s after the sync that flushed it."""
    node = Node()
    docs = [_svc("ns1", "svc1", "172.30.0.41", "p80", 80), _eps("ns1", "svc1", "p80", 80, "10.0.1.1")]
    snap = snapshot_of(docs)
    node.sync(snap)
    snap = next_snapshot(snap, docs[:1])
    node.sync(snap)
    node.now_s += 0.5
    assert node.sync(snap).deleted_chains == ()
    node.now_s += 0.9
    assert node.sync(snap).deleted_chains == ()
    node.now_s += 1.5
    assert len(node.sync(snap).deleted_chains) == 2  # the service chain and its endpoint chain


def test_failure_makes_the_next_sync_full() -> None:
    """After failed(), the next render is a full sync that rewrites every Service."""
    node = Node()
    docs = [_svc("ns1", "svc1", "172.30.0.41", "p80", 80), _eps("ns1", "svc1", "p80", 80, "10.0.1.1")]
    snap = snapshot_of(docs)
    node.sync(snap)
    node.renderer.render(next_snapshot(snap, docs))
    node.renderer.failed()
    result = node.sync(snap)
    assert result.full and result.written_ports == 1
    assert "delete chain ip kube-proxy filter-input" not in result.text  # base chains recreated only once


def test_full_sync_over_a_previous_run_flushes_its_leftover_chains() -> None:
    """TestSyncProxyRulesStartup: chains a previous kube-proxy left are flushed as stale on the first sync."""
    node = Node()
    node.kernel.apply("add table ip kube-proxy\nadd chain ip kube-proxy service-OLD0000-ns9/gone/tcp/p\n")
    result = node.sync(snapshot_of([]))
    assert "flush chain ip kube-proxy service-OLD0000-ns9/gone/tcp/p" in result.text
    assert result.stale_chains == {"service-OLD0000-ns9/gone/tcp/p"}


def test_partial_syncs_without_listing_write_the_same() -> None:
    """Trusting the committed state (no listing on partial syncs) writes exactly what listing writes."""
    svc = [_svc(f"ns{i}", f"svc{i}", f"172.30.0.{40 + i}", "p80", 80) for i in range(4)]
    eps = [_eps(f"ns{i}", f"svc{i}", "p80", 80, f"10.0.{i}.1", f"10.0.{i}.2") for i in range(4)]
    one = [_eps(f"ns{i}", f"svc{i}", "p80", 80, f"10.0.{i}.3") for i in range(4)]
    states = [svc + eps, svc[:2] + eps[:2], svc + one[:3], svc[1:] + eps[1:], svc + eps, svc[:1]]
    nodes = Node(listing=True), Node(listing=False)
    snaps = [snapshot_of(states[0])]
    for docs in states[1:]:
        snaps.append(next_snapshot(snaps[-1], docs))
    for snap in snaps:
        texts = []
        for node in nodes:
            result = node.sync(snap)
            texts.append((result.cleanup, result.text))
            node.now_s += 0.7
        assert texts[0] == texts[1]
    assert nodes[0].state() == nodes[1].state()
