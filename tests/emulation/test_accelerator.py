"""The accelerator keeps what it derives in side tables: rules and chains stay plain values."""

from __future__ import annotations

import copy
import gc
import pickle
import random

from emulation.clock import ManualClock
from emulation.netfilter import Chain, Netns, Rule, load
from emulation.netfilter.accel import Accelerator
from tests.benchmarks.bench_netfilter import kube_ruleset
from tests.emulation.helpers import KUBE_NAT, make_node, pkt


def test_rules_and_chains_hold_only_their_fields() -> None:
    """No cache slot on a rule or chain: what the accelerator derives lives beside them."""
    assert set(Rule.__slots__) == {"chain", "basic", "matches", "target", "line", "counters", "uid"}
    assert set(Chain.__slots__) == {"name", "policy", "rules", "counters", "__weakref__"}


def test_a_chain_is_compiled_once_for_every_netns() -> None:
    """Two Netns on one ruleset share the compiled chain (it depends on the chain alone)."""
    rules = load(kube_ruleset(40, 2))
    a, b = (Netns(make_node(), ManualClock(), ruleset=rules) for _ in range(2))
    chain = rules.chain("nat", "KUBE-SERVICES")
    assert chain is not None
    assert a.accelerator.compiled(chain) is b.accelerator.compiled(chain)
    assert a.accelerator.index(chain) is not None


def test_a_freed_chain_leaves_the_side_table() -> None:
    """A chain's entry goes with the chain, so its identity can never name another chain."""
    accel = Accelerator()
    rules = load(KUBE_NAT)
    for table in rules.tables.values():
        for chain in table.chains.values():
            accel.compiled(chain)
    assert accel._chains
    del rules, table, chain
    gc.collect()
    assert not accel._chains


def test_a_copied_netns_evaluates_like_the_original() -> None:
    """A deep copy (kproxy copies nodes to simulate) shares the accelerator and gives the same outcomes."""
    ns = Netns(make_node(), ManualClock(), ruleset=load(KUBE_NAT))
    for i in range(3):
        ns.send(pkt(dst="172.30.0.41", dport=80, sport=10 + i), random.Random(i))
    twin = copy.deepcopy(ns)
    assert twin.accelerator is ns.accelerator
    for i in range(5):
        p = pkt(dst="172.30.0.41", dport=80, sport=100 + i)
        assert twin.send(p, random.Random(i)) == ns.send(p, random.Random(i))
    assert twin.save(counters=True) == ns.save(counters=True)
    assert isinstance(pickle.loads(pickle.dumps(ns.accelerator)), Accelerator)
