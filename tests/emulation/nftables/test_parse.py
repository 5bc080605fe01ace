"""The nft parser: block and command forms, atomic transactions, errors naming the line."""

from __future__ import annotations

import pytest

from emulation.nftables import (
    ChainType,
    Family,
    NftablesError,
    NftHook,
    Unknown,
    Verdict,
    VerdictKind,
    apply,
    list_ruleset,
    load,
)
from tests.emulation.nftables.rulesets import KUBE_PROXY_BLOCK, KUBE_PROXY_COMMANDS, MISC


def test_block_form_reads_base_chains_with_named_priorities() -> None:
    """``priority dstnat - 10`` is -110 and ``srcnat`` is 100, as nft's std_prios."""
    table = load(KUBE_PROXY_BLOCK).tables[(Family.IP, "kube-proxy")]
    pre = table.chains["filter-prerouting-pre-dnat"]
    assert (pre.type, pre.hook, pre.priority) == (ChainType.FILTER, NftHook.PREROUTING, -110)
    assert table.chains["nat-postrouting"].priority == 100


def test_block_form_resolves_forward_references() -> None:
    """A block-form rule may jump to a chain declared later in the same block."""
    rs = load("table ip t {\n chain a {\n  jump b\n }\n chain b {\n  accept\n }\n}\n")
    rule = rs.tables[(Family.IP, "t")].chains["a"].rules[0]
    assert rule.stmts[0].verdict == Verdict(VerdictKind.JUMP, "b")  # type: ignore[union-attr]


def test_command_form_refuses_a_jump_to_a_chain_not_yet_added() -> None:
    """As nft 1.0.6, an ``add rule`` naming a chain added only later fails, naming its line."""
    text = "add table ip t\nadd chain ip t a\nadd rule ip t a jump b\nadd chain ip t b\n"
    with pytest.raises(NftablesError, match=r"^line 3: no such chain 'b'"):
        load(text)


def test_command_form_builds_the_same_objects_as_knftables_writes() -> None:
    """The knftables-style transaction yields its chains, rules, sets and elements."""
    table = load(KUBE_PROXY_COMMANDS).tables[(Family.IP, "kube-proxy")]
    assert table.comment == "rules for kube-proxy"
    assert len(table.chains["masquerading"].rules) == 3
    assert [e.data for e in table.sets["service-ips"].elements] == [
        Verdict(VerdictKind.GOTO, "service-ULMVA6XW-ns1/svc1/tcp/p80")
    ]


def test_failed_transaction_leaves_the_ruleset_as_it_was() -> None:
    """An error late in a transaction undoes its earlier commands (one batch)."""
    before = load(KUBE_PROXY_COMMANDS)
    listing = list_ruleset(before)
    bad = "flush chain ip kube-proxy services\nadd rule ip kube-proxy services bogus-expression 1\n"
    with pytest.raises(NftablesError, match=r"^line 2: unknown expression 'bogus-expression'"):
        apply(before, bad)
    assert list_ruleset(before) == listing
    assert len(before.tables[(Family.IP, "kube-proxy")].chains["services"].rules) == 1


def test_delete_element_and_flush_map() -> None:
    """``delete element`` removes one key; ``flush map`` empties the map."""
    rs = load(KUBE_PROXY_BLOCK)
    rs = apply(rs, "delete element ip kube-proxy cluster-ips { 172.30.0.41 }\n")
    assert len(rs.tables[(Family.IP, "kube-proxy")].sets["cluster-ips"].elements) == 2
    rs = apply(rs, "flush map ip kube-proxy service-ips\n")
    assert rs.tables[(Family.IP, "kube-proxy")].sets["service-ips"].elements == ()


def test_delete_element_that_is_absent_fails_but_destroy_does_not() -> None:
    """``delete`` of a missing element is ENOENT; ``destroy`` ignores it."""
    rs = load(KUBE_PROXY_BLOCK)
    with pytest.raises(NftablesError, match="no such element"):
        apply(rs, "delete element ip kube-proxy cluster-ips { 1.2.3.4 }\n")
    assert apply(rs, "destroy element ip kube-proxy cluster-ips { 1.2.3.4 }\n") is not rs


def test_deleting_a_chain_still_jumped_to_is_refused() -> None:
    """A chain referenced by a rule cannot be deleted (EBUSY); once flushed away it can."""
    rs = load(KUBE_PROXY_BLOCK)
    with pytest.raises(NftablesError, match="EBUSY"):
        apply(rs, "delete chain ip kube-proxy masquerading\n")
    rs = apply(rs, "flush chain ip kube-proxy nat-postrouting\ndelete chain ip kube-proxy masquerading\n")
    assert "masquerading" not in rs.tables[(Family.IP, "kube-proxy")].chains


def test_rule_without_terminator_before_brace_is_an_error() -> None:
    """As nft: a rule must end with a newline or ';' before the chain's '}'."""
    with pytest.raises(NftablesError, match="line 1: a rule must end"):
        load("table ip t { chain c { accept } }\n")


def test_unknown_expression_is_an_error_in_strict_mode_and_unknown_in_lenient() -> None:
    """Strict parsing rejects ``osf`` (not modelled); lenient parsing keeps it as an Unknown statement."""
    text = 'table ip t {\n chain c {\n  osf name "x" accept\n }\n}\n'
    with pytest.raises(NftablesError, match="line 3: unknown expression 'osf'"):
        load(text)
    rule = load(text, strict=False).tables[(Family.IP, "t")].chains["c"].rules[0]
    assert rule.stmts == (Unknown('osf name "x" accept'),)


def test_bad_value_names_the_line_and_value() -> None:
    """An address that is not one is reported with its line."""
    with pytest.raises(NftablesError, match=r"line 2: .*'10.0.0.300' is not an ipv4_addr"):
        load("add table ip t\nadd set ip t s { type ipv4_addr ; elements = { 10.0.0.300 } ; }\n")


def test_misc_expressions_parse() -> None:
    """The inet and ip6 tables of other components parse, with every statement known."""
    rs = load(MISC)
    assert set(rs.tables) == {(Family.INET, "cni"), (Family.IP6, "v6")}
    for table in rs.tables.values():
        for chain in table.chains.values():
            for rule in chain.rules:
                assert not any(isinstance(s, Unknown) for s in rule.stmts)


def test_insert_rule_goes_first_and_delete_rule_by_handle() -> None:
    """``insert rule`` prepends; ``delete rule ... handle N`` removes that rule."""
    rs = load("add table ip t\nadd chain ip t c\nadd rule ip t c accept\ninsert rule ip t c drop\n")
    chain = rs.tables[(Family.IP, "t")].chains["c"]
    assert [str(r.stmts[0].verdict) for r in chain.rules] == ["drop", "accept"]  # type: ignore[union-attr]
    rs = apply(rs, f"delete rule ip t c handle {chain.rules[0].handle}\n")
    assert len(rs.tables[(Family.IP, "t")].chains["c"].rules) == 1


def test_dstnat_priority_is_refused_outside_prerouting() -> None:
    """As nft 1.0.6: ``priority dstnat`` at the output hook is invalid in this context."""
    with pytest.raises(NftablesError, match="line 2: priority dstnat is invalid at hook output"):
        load("add table ip t\nadd chain ip t c { type nat hook output priority dstnat ; }\n")


def test_error_inside_a_table_block_names_its_own_line() -> None:
    """An error on line 3 of a block is reported at line 3, not at the table's line."""
    with pytest.raises(NftablesError, match=r"^line 3: "):
        load("table ip t {\n chain c {\n  ip daddr 10.0.0.300 accept\n }\n}\n")
