"""iptables-restore semantics: atomicity, --noflush, chain deletion."""

from __future__ import annotations

import pytest

from emulation.errors import NetfilterError
from emulation.netfilter import Ruleset, apply_restore, save

BASE = """*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KEEP - [0:0]
:REDO - [0:0]
-A INPUT -j KEEP
-A KEEP -s 10.0.0.1 -j ACCEPT
-A REDO -s 10.0.0.2 -j ACCEPT
COMMIT
"""


def test_failed_restore_leaves_state_unchanged() -> None:
    """An error on any line raises, names that line, and the previous ruleset is intact."""
    state = apply_restore(Ruleset(), BASE)
    before = save(state)
    bad = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n-A INPUT -j MISSING\nCOMMIT\n"
    with pytest.raises(NetfilterError) as err:
        apply_restore(state, bad)
    assert err.value.line == 4
    assert save(state) == before


def test_restore_without_noflush_replaces_named_tables() -> None:
    """Without --noflush a table in the input loses every chain and rule it had."""
    state = apply_restore(Ruleset(), BASE)
    state = apply_restore(state, "*filter\n:INPUT DROP [0:0]\nCOMMIT\n")
    assert save(state) == "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"


def test_noflush_flushes_only_declared_chains() -> None:
    """With --noflush a ``:CHAIN`` line flushes that chain; others keep their rules."""
    state = apply_restore(Ruleset(), BASE)
    state = apply_restore(
        state, "*filter\n:REDO - [0:0]\n-A REDO -s 10.0.0.3 -j ACCEPT\nCOMMIT\n", noflush=True
    )
    text = save(state)
    assert "-A KEEP -s 10.0.0.1/32 -j ACCEPT" in text
    assert "-A REDO -s 10.0.0.3/32 -j ACCEPT" in text
    assert "10.0.0.2" not in text


def test_noflush_builtin_chain_line_sets_policy_but_keeps_rules() -> None:
    """With --noflush, ``:INPUT DROP`` changes the policy and keeps INPUT's rules (as the kernel does)."""
    state = apply_restore(Ruleset(), BASE)
    state = apply_restore(state, "*filter\n:INPUT DROP [0:0]\nCOMMIT\n", noflush=True)
    text = save(state)
    assert ":INPUT DROP [0:0]" in text
    assert "-A INPUT -j KEEP" in text


def test_noflush_leaves_other_tables_alone() -> None:
    """A restore of the nat table does not touch the filter table."""
    state = apply_restore(Ruleset(), BASE)
    state = apply_restore(state, "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n")
    assert "-A KEEP" in save(state)


def test_deleting_a_referenced_chain_fails() -> None:
    """``-X`` of a chain that a rule still jumps to is refused, naming the line."""
    state = apply_restore(Ruleset(), BASE)
    with pytest.raises(NetfilterError, match="referenced") as err:
        apply_restore(state, "*filter\n:KEEP - [0:0]\n-X KEEP\nCOMMIT\n", noflush=True)
    assert err.value.line == 3


def test_kube_proxy_stale_chain_deletion() -> None:
    """kube-proxy's ``:CHAIN`` + ``-X CHAIN`` deletes an unreferenced chain in a noflush restore."""
    state = apply_restore(Ruleset(), BASE)
    state = apply_restore(state, "*filter\n:REDO - [0:0]\n-X REDO\nCOMMIT\n", noflush=True)
    assert ":REDO" not in save(state)


def test_insert_and_delete_rules() -> None:
    """``-I CHAIN n`` inserts at position n and ``-D`` removes by number or by spec."""
    state = apply_restore(Ruleset(), BASE)
    state = apply_restore(state, "*filter\n-I KEEP 1 -s 10.0.0.9 -j DROP\nCOMMIT\n", noflush=True)
    rules = state.tables["filter"].chains["KEEP"].rules
    assert rules[0].text() == "-A KEEP -s 10.0.0.9/32 -j DROP"
    state = apply_restore(state, "*filter\n-D KEEP -s 10.0.0.9/32 -j DROP\n-D KEEP 1\nCOMMIT\n", noflush=True)
    assert state.tables["filter"].chains["KEEP"].rules == ()


def test_user_chain_with_policy_is_refused() -> None:
    """A user chain line must use ``-`` as its policy."""
    with pytest.raises(NetfilterError, match="cannot have a policy"):
        apply_restore(Ruleset(), "*filter\n:MINE ACCEPT [0:0]\nCOMMIT\n")
