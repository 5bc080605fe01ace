"""The hook order is declared once, by priority, and everything that runs hooks reads it."""

from __future__ import annotations

import random

from emulation.netfilter import CtState, Delivery, Hook, Verdict
from emulation.netfilter.hooks import CONNTRACK, HOOK_PRIORITIES, NAT, SOURCE_NAT_HOOKS, STAGES, hooks_of
from emulation.netfilter.rules import BUILTIN_CHAINS
from tests.emulation.helpers import netns, pkt


def test_stages_run_by_priority() -> None:
    """Each hook's stages are its tables (and conntrack) sorted by netfilter_ipv4.h priority."""
    for hook, stages in HOOK_PRIORITIES.items():
        priorities = [p for _, p in stages]
        assert priorities == sorted(priorities)
        assert STAGES[hook] == tuple(name for name, _ in stages)
    assert STAGES[Hook.PREROUTING] == ("raw", CONNTRACK, "mangle", NAT)
    assert STAGES[Hook.OUTPUT] == ("raw", CONNTRACK, "mangle", NAT, "filter", "security")


def test_nat_maps_the_source_after_routing_and_the_destination_before() -> None:
    """NF_IP_PRI_NAT_SRC hooks are INPUT and POSTROUTING; PREROUTING and OUTPUT map the destination."""
    assert {Hook.INPUT, Hook.POSTROUTING} == SOURCE_NAT_HOOKS


def test_built_in_chains_are_the_hooks_a_table_registers_at() -> None:
    """iptables-save's built-in chains per table follow from the same table, in hook order."""
    assert BUILTIN_CHAINS == {
        "raw": ("PREROUTING", "OUTPUT"),
        "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
        "filter": ("INPUT", "FORWARD", "OUTPUT"),
        "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
        "security": ("INPUT", "FORWARD", "OUTPUT"),
    }
    assert hooks_of("raw") == (Hook.PREROUTING, Hook.OUTPUT)


def test_outcome_fields_are_enums_equal_to_their_words() -> None:
    """Verdict, delivery and ctstate are enum members that compare (and hash) as the kernel's words."""
    out = netns().send(pkt(dst="192.168.0.2"), random.Random(1))
    assert out.verdict is Verdict.ACCEPT and out.verdict == "ACCEPT"
    assert out.delivery is Delivery.LOCAL and out.delivery == "local"
    assert out.ctstate is CtState.NEW and {"NEW": 1}[out.ctstate] == 1
    assert f"{out.verdict}/{out.delivery}" == "ACCEPT/local"
