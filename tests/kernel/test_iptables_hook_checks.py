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

from tests.emulation.test_nat_hook_checks import (
    ACCEPTED,
    ICMP_MATCH,
    PROTO_SAVED,
    REFUSED,
    filt,
)
from tests.kernel.conftest import Executor
from tests.kernel.restore import Restorer

KERNEL_TOOLS = ("iptables-restore", "ip6tables-restore", "iptables-save", "ip6tables-save", "iptables", "ip6tables")


#: (id, version, restore text, line of the refused rule, message regex) the kernel refuses.

#: (id, version, restore text) the kernel loads.


#: (version, rule, refused) for ``-m icmp`` / ``-m icmp6``, as the real tools do.

#: ``-p`` as given -> as iptables-save / ip6tables-save 1.8.9 print it (same for both).


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
