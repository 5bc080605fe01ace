"""Load refuses a target reachable from a hook it is not usable from (the kernel's hook check).

``mark_source_chains`` (net/ipv4/netfilter/ip_tables.c) gives each rule the built-in hooks it
is reachable from through jumps and gotos; ``xt_check_target`` (net/netfilter/x_tables.c)
refuses a target whose ``.hooks`` do not cover them: SNAT POSTROUTING/INPUT, MASQUERADE
POSTROUTING, DNAT and REDIRECT PREROUTING/OUTPUT, REJECT INPUT/FORWARD/OUTPUT. The cases are
shared with tests/kernel/test_iptables_hook_checks.py, which loads them with the real tools.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from emulation.errors import NetfilterError
from emulation.netfilter import Ruleset, apply_restore, load, save

NAT_HEAD = """*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
"""
FILTER_HEAD = """*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
"""
DNAT = "-p tcp -j DNAT --to-destination 10.0.0.1:80"


def nat(*lines: str) -> str:
    return NAT_HEAD + "".join(f"{line}\n" for line in lines) + "COMMIT\n"


def filt(*lines: str) -> str:
    return FILTER_HEAD + "".join(f"{line}\n" for line in lines) + "COMMIT\n"


#: (id, version, restore text, line of the refused rule, message regex) the kernel refuses.
REFUSED: list[tuple[str, int, str, int, str]] = [
    (
        "masquerade-prerouting",
        4,
        nat("-A PREROUTING -j MASQUERADE"),
        6,
        r"MASQUERADE target: used from hooks PREROUTING, but only usable from POSTROUTING",
    ),
    (
        "masquerade-via-user-chain",
        4,
        nat(":M - [0:0]", "-A PREROUTING -j M", "-A M -j MASQUERADE"),
        8,
        r"MASQUERADE target: used from hooks PREROUTING, but only usable from POSTROUTING",
    ),
    (
        "masquerade-via-goto",
        4,
        nat(":M - [0:0]", "-A PREROUTING -g M", "-A M -j MASQUERADE"),
        8,
        r"MASQUERADE target: used from hooks PREROUTING, but only usable from POSTROUTING",
    ),
    (
        "dnat-from-postrouting",
        4,
        nat(":A - [0:0]", ":B - [0:0]", "-A POSTROUTING -j A", "-A A -j B", f"-A B {DNAT}"),
        10,
        r"DNAT target: used from hooks POSTROUTING, but only usable from PREROUTING/OUTPUT",
    ),
    (
        "dnat-input",
        4,
        nat(f"-A INPUT {DNAT}"),
        6,
        r"DNAT target: used from hooks INPUT, but only usable from PREROUTING/OUTPUT",
    ),
    (
        "snat-from-output",
        4,
        nat(":S - [0:0]", "-A OUTPUT -j S", "-A S -j SNAT --to-source 10.0.0.9"),
        8,
        r"SNAT target: used from hooks OUTPUT, but only usable from INPUT/POSTROUTING",
    ),
    (
        "redirect-postrouting",
        4,
        nat("-A POSTROUTING -p tcp -j REDIRECT --to-ports 8080"),
        6,
        r"REDIRECT target: used from hooks POSTROUTING, but only usable from PREROUTING/OUTPUT",
    ),
    (
        "dnat-in-chain-from-prerouting-and-postrouting",
        4,
        nat(":X - [0:0]", "-A PREROUTING -j X", "-A POSTROUTING -j X", f"-A X {DNAT}"),
        9,
        r"DNAT target: used from hooks PREROUTING/POSTROUTING, but only usable from PREROUTING/OUTPUT",
    ),
    (
        "masquerade-prerouting-ipv6",
        6,
        nat("-A PREROUTING -j MASQUERADE"),
        6,
        r"ip6_tables: MASQUERADE target: used from hooks PREROUTING",
    ),
]

#: (id, version, restore text) the kernel loads.
ACCEPTED: list[tuple[str, int, str]] = [
    ("reject-reached-only-from-input", 4, filt(":R - [0:0]", "-A INPUT -j R", "-A R -j REJECT")),
    (
        "reject-from-every-filter-hook",
        4,
        filt(":R - [0:0]", "-A INPUT -j R", "-A FORWARD -g R", "-A OUTPUT -j R", "-A R -j REJECT"),
    ),
    ("unreachable-chain", 4, nat(":U - [0:0]", "-A U -j MASQUERADE", f"-A U {DNAT}")),
    (
        "dnat-from-prerouting-and-output",
        4,
        nat(":X - [0:0]", "-A PREROUTING -j X", "-A OUTPUT -j X", f"-A X {DNAT}"),
    ),
    (
        "snat-input-and-postrouting",
        4,
        nat(":S - [0:0]", "-A INPUT -j S", "-A POSTROUTING -j S", "-A S -j SNAT --to-source 10.0.0.9"),
    ),
    ("masquerade-postrouting-ipv6", 6, nat("-A POSTROUTING -j MASQUERADE")),
]


@pytest.mark.parametrize(("version", "text", "line", "message"),
                         [pytest.param(*c[1:], id=c[0]) for c in REFUSED])  # fmt: skip
@pytest.mark.parametrize("strict", [True, False])
def test_refused(version: int, text: str, line: int, message: str, strict: bool) -> None:
    with pytest.raises(NetfilterError, match=message) as info:
        load(text, version=version, strict=strict)
    assert info.value.line == line
    assert info.value.text == text.splitlines()[line - 1]


@pytest.mark.parametrize(("version", "text"), [pytest.param(*c[1:], id=c[0]) for c in ACCEPTED])
@pytest.mark.parametrize("strict", [True, False])
def test_accepted(version: int, text: str, strict: bool) -> None:
    rs = load(text, version=version, strict=strict)
    assert load(save(rs), version=version, strict=strict) == rs


def test_noflush_jump_that_makes_an_earlier_rule_reachable_is_refused() -> None:
    """A later restore adding the jump refuses too, and leaves the ruleset as it was."""
    rs = load(nat(":M - [0:0]", "-A M -j MASQUERADE"))
    with pytest.raises(NetfilterError, match=r"MASQUERADE target: used from hooks PREROUTING") as info:
        apply_restore(rs, "*nat\n-A PREROUTING -j M\nCOMMIT\n", noflush=True)
    assert info.value.line == 7  # the MASQUERADE rule's line in the earlier load
    assert save(rs) == save(load(nat(":M - [0:0]", "-A M -j MASQUERADE")))


def test_other_tables_untouched_by_the_restore_are_not_rechecked() -> None:
    rs = load(nat("-A POSTROUTING -j MASQUERADE"))
    rs = apply_restore(rs, filt("-A INPUT -j REJECT"), noflush=True)
    assert "REJECT" in save(rs) and "MASQUERADE" in save(rs)


def test_kube_proxy_rendered_rules_load() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_iptables as bench

    from kproxy.modes.iptables import IptablesConfig, IptablesRenderer

    snap = bench.snapshot(bench.documents(5, 3))
    config = IptablesConfig(node_ips=(bench.NODE_IP,), cluster_cidr=("10.0.0.0/8",))
    text = IptablesRenderer(config).render(snap, full=True).text
    assert "-j DNAT" in text and "-j MASQUERADE" in text
    for strict in (True, False):
        rs = apply_restore(Ruleset(), text, noflush=True, strict=strict)
        rs = apply_restore(rs, bench.JUMPS, noflush=True, strict=strict)
        assert any(r.chain == "PREROUTING" for _, r in rs.rules())


# -- (2) -m icmp / -m icmp6 need their protocol; (3) -p saves as iptables-save prints it ---------

#: (version, rule, refused) for ``-m icmp`` / ``-m icmp6``, as the real tools do.
ICMP_MATCH: list[tuple[int, str, bool]] = [
    (4, "-A INPUT -m icmp --icmp-type 8 -j ACCEPT", True),
    (4, "-A INPUT ! -p icmp -m icmp --icmp-type 8 -j ACCEPT", True),
    (4, "-A INPUT -p tcp -m icmp --icmp-type 8 -j ACCEPT", True),
    (4, "-A INPUT -p icmp -m icmp --icmp-type 8 -j ACCEPT", False),
    (4, "-A INPUT -p 1 -m icmp --icmp-type 8 -j ACCEPT", False),
    (4, "-A INPUT -p ICMP -m icmp --icmp-type 8 -j ACCEPT", False),
    (6, "-A INPUT -m icmp6 --icmpv6-type 128 -j ACCEPT", True),
    (6, "-A INPUT ! -p icmpv6 -m icmp6 --icmpv6-type 128 -j ACCEPT", True),
    (6, "-A INPUT -p tcp -m icmp6 --icmpv6-type 128 -j ACCEPT", True),
    (6, "-A INPUT -p icmp -m icmp6 --icmpv6-type 128 -j ACCEPT", True),
    (6, "-A INPUT -p icmpv6 -m icmp6 --icmpv6-type 128 -j ACCEPT", False),
    (6, "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 128 -j ACCEPT", False),
    (6, "-A INPUT -p 58 -m icmp6 --icmpv6-type 128 -j ACCEPT", False),
]

#: ``-p`` as given -> as iptables-save / ip6tables-save 1.8.9 print it (same for both).
PROTO_SAVED: list[tuple[str, str]] = [
    ("6", "tcp"), ("17", "udp"), ("132", "sctp"), ("136", "udplite"), ("1", "icmp"), ("TCP", "tcp"),
    ("50", "esp"), ("51", "ah"), ("47", "gre"), ("33", "dccp"), ("135", "mobility-header"),
    ("mh", "mobility-header"), ("200", "200"), ("icmpv6", "ipv6-icmp"), ("58", "ipv6-icmp"),
]  # fmt: skip


@pytest.mark.parametrize(("version", "rule", "refused"), ICMP_MATCH)
@pytest.mark.parametrize("strict", [True, False])
def test_icmp_match_needs_its_protocol(version: int, rule: str, refused: bool, strict: bool) -> None:
    text = filt(rule)
    if refused:
        name, number = ("icmp", 1) if version == 4 else ("icmp6", 58)
        with pytest.raises(NetfilterError, match=rf"{name} match: only valid for protocol {number}") as info:
            load(text, version=version, strict=strict)
        assert info.value.line == 5
    else:
        load(text, version=version, strict=strict)


@pytest.mark.parametrize("version", [4, 6])
@pytest.mark.parametrize(("given", "saved"), PROTO_SAVED)
def test_protocol_saves_as_iptables_save(version: int, given: str, saved: str) -> None:
    rs = load(filt(f"-A INPUT -p {given} -j ACCEPT"), version=version, strict=True)
    assert f"-A INPUT -p {saved} -j ACCEPT" in save(rs).splitlines()
    assert load(save(rs), version=version, strict=True) == rs
