# ruff: noqa: E501  (iptables rules and test names are kept whole to stay readable)
"""The hook check: a target reachable from a hook it is not usable from is refused, on the
emulator and by the real ``iptables-restore``; and ``-m icmp`` / ``-m icmp6`` need their protocol,
and ``-p`` saves as ``iptables-save`` prints it.

``mark_source_chains`` (net/ipv4/netfilter/ip_tables.c) gives each rule the built-in hooks it
is reachable from through jumps and gotos; ``xt_check_target`` (net/netfilter/x_tables.c)
refuses a target whose ``.hooks`` do not cover them: SNAT POSTROUTING/INPUT, MASQUERADE
POSTROUTING, DNAT and REDIRECT PREROUTING/OUTPUT, REJECT INPUT/FORWARD/OUTPUT. The Linux
executor loads every case with the default tool and with the legacy (x_tables) one when
present, in a namespace made for the module (deleted after).

The nf_tables backend words its errors differently (no ``used from hooks`` line: the kernel's
``nft_compat`` validation fails the transaction with EINVAL / EOPNOTSUPP), so on Linux only
the outcome is compared; the emulator's refusal must also name the line and the hooks.
"""

from __future__ import annotations

import re

import pytest

from tests.kernel.conftest import Executor
from tests.kernel.restore import Restorer

KERNEL_TOOLS = ("iptables-restore", "ip6tables-restore", "iptables-save", "ip6tables-save", "iptables", "ip6tables")

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


@pytest.mark.parametrize(("version", "text", "line", "message"),
                         [pytest.param(*c[1:], id=c[0]) for c in REFUSED])  # fmt: skip
def test_target_used_from_a_hook_it_does_not_serve_is_refused(
    executor: Executor, restorers: list[Restorer], version: int, text: str, line: int, message: str
) -> None:
    """The restore fails; the emulator names the rule's line and the hooks it is used from."""
    for restorer in restorers:
        got = restorer.restore(text, version=version)
        assert not got.loaded, f"{restorer.name} loaded it"
        if executor is Executor.EMULATED:
            assert re.search(message, got.error), got.error
            assert (got.line, got.text) == (line, text.splitlines()[line - 1])


@pytest.mark.parametrize(("version", "text"), [pytest.param(*c[1:], id=c[0]) for c in ACCEPTED])
def test_target_used_only_from_its_hooks_is_loaded(restorers: list[Restorer], version: int, text: str) -> None:
    """The restore succeeds (an unreachable chain is checked against no hook at all)."""
    for restorer in restorers:
        got = restorer.restore(text, version=version)
        assert got.loaded, f"{restorer.name}: {got.error}"


@pytest.mark.parametrize(("version", "rule", "refused"), ICMP_MATCH)
def test_icmp_match_needs_its_protocol(
    executor: Executor, restorers: list[Restorer], version: int, rule: str, refused: bool
) -> None:
    """``-m icmp`` needs ``-p icmp`` (``-m icmp6`` ``-p icmpv6``), as ``icmp_checkentry`` wants."""
    for restorer in restorers:
        got = restorer.restore(filt(rule), version=version)
        assert got.loaded != refused, f"{restorer.name}: {got}"
        if refused and executor is Executor.EMULATED:
            name, number = ("icmp", 1) if version == 4 else ("icmp6", 58)
            assert re.search(rf"{name} match: only valid for protocol {number}", got.error), got.error
            assert got.line == 5


@pytest.mark.parametrize("version", [4, 6])
@pytest.mark.parametrize(("given", "saved"), PROTO_SAVED)
def test_protocol_saves_as_iptables_save(restorers: list[Restorer], version: int, given: str, saved: str) -> None:
    """``-p`` given by number or alias is printed by name, as iptables-save 1.8.9 prints it."""
    for restorer in restorers:
        got = restorer.restore(filt(f"-A INPUT -p {given} -j ACCEPT"), version=version)
        assert got.rules == (f"-A INPUT -p {saved} -j ACCEPT",), f"{restorer.name}: {got}"
