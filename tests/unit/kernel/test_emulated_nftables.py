# ruff: noqa: E501  (test names and docstrings are kept whole to stay readable)
"""The emulated nftables kernel: atomic transactions, its own table listed, conntrack cleared, other tables kept."""

from __future__ import annotations

import random

import pytest

from emulation import Packet
from kproxy.errors import KernelError
from kproxy.kernel import EmulatedNftables, NftablesKernel, emulated_nftables, run_now
from kproxy.kernel.conntrack import ConntrackFilter
from kproxy.model.names import IPFamily
from kproxy.modes.nftables import NftablesConfig, NftablesMode, canonical_listing, render_transaction
from tests.scenarios import NODE, NODE_IP, cluster
from tests.unit.modes.kube import next_snapshot, snapshot_of

FIREWALL = """\
table inet firewall {
\tchain input {
\t\ttype filter hook input priority filter + 10; policy accept;
\t\ttcp dport 22 accept
\t}
}
"""
CONFIG = NftablesConfig(node_ips=(NODE_IP,), cluster_cidr=("10.0.0.0/8",))


def _kernel() -> EmulatedNftables:
    return emulated_nftables((NODE_IP,), IPFamily.IPv4)


def test_is_an_nftables_kernel_and_lists_nothing_before_the_first_sync() -> None:
    """The adapter implements NftablesKernel; with no kube-proxy table it lists ''."""
    kernel = _kernel()
    assert isinstance(kernel, NftablesKernel)
    assert run_now(kernel.list_ruleset()) == ""


def test_lists_only_its_family_table_and_leaves_other_tables_alone() -> None:
    """Beside a firewall's inet table, the adapter lists and writes only `ip kube-proxy`; the other table stays."""
    kernel = _kernel()
    kernel.netns.apply(FIREWALL)
    run_now(kernel.run(render_transaction(snapshot_of(cluster(), hostname=NODE), CONFIG)))
    listing = run_now(kernel.list_ruleset())
    assert listing.startswith("table ip kube-proxy {") and "inet firewall" not in listing
    assert kernel.netns.list_ruleset().startswith(FIREWALL)


def test_refused_transaction_names_the_line_and_changes_nothing() -> None:
    """A line the emulator refuses raises KernelError quoting it; the table is as before."""
    kernel = _kernel()
    run_now(kernel.run(render_transaction(snapshot_of(cluster(), hostname=NODE), CONFIG)))
    before = run_now(kernel.list_ruleset())
    bad = "add chain ip kube-proxy fresh\nadd rule ip kube-proxy fresh jump nowhere\n"
    with pytest.raises(KernelError, match=r"line 2.*failing line: add rule ip kube-proxy fresh jump nowhere"):
        run_now(kernel.run(bad))
    assert run_now(kernel.list_ruleset()) == before
    assert kernel.transactions == 1


def test_clear_conntrack_deletes_the_matching_udp_flows() -> None:
    """A UDP flow DNATed through the table is deleted by a filter on its ClusterIP, and only it."""
    kernel = _kernel()
    run_now(kernel.run(render_transaction(snapshot_of(cluster(), hostname=NODE), CONFIG)))
    udp = Packet(src="10.0.0.2", dst="172.30.0.43", sport=5000, dport=81, protocol="udp", in_interface="eth0")
    outcome = kernel.netns.send(udp, random.Random(0))
    assert outcome.verdict == "ACCEPT" and outcome.dnat
    assert len(kernel.netns.conntrack.entries()) == 1
    other = ConntrackFilter(family=IPFamily.IPv4, protocol="udp", orig_dst="172.30.0.99")
    assert run_now(kernel.clear_conntrack([other])) == 0
    mine = ConntrackFilter(family=IPFamily.IPv4, protocol="udp", orig_dst="172.30.0.43", orig_dst_port=81)
    assert run_now(kernel.clear_conntrack([mine])) == 1
    assert kernel.netns.conntrack.entries() == []


def test_mode_partial_syncs_leave_the_table_a_full_sync_makes() -> None:
    """Through the emulated kernel, a Service removed by partial syncs leaves the table of a fresh full sync."""
    docs = cluster()
    kept = [d for d in docs if d["metadata"]["namespace"] != "ns1"]
    clock = [0.0]
    kernel = _kernel()
    mode = NftablesMode(CONFIG, kernel, now=lambda: clock[0])
    first = snapshot_of(docs, hostname=NODE)
    run_now(mode.apply(first))
    snap = next_snapshot(first, kept, hostname=NODE)
    for _ in range(3):  # flush, then delete the stale chains more than a second later
        clock[0] += 1.5
        run_now(mode.apply(snap))
        snap = next_snapshot(snap, kept, hostname=NODE)
    assert not any(r.full for r in mode.history[1:])
    fresh = _kernel()
    run_now(NftablesMode(CONFIG, fresh, now=lambda: 0.0).apply(snapshot_of(kept, hostname=NODE)))
    assert canonical_listing(run_now(kernel.list_ruleset())) == canonical_listing(run_now(fresh.list_ruleset()))
