# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Load checks and save text: what ``iptables-restore`` refuses, and how ``iptables-save`` prints
what it loads, on the emulator and on the real tools.

Each rule of :data:`ACCEPTED` is restored (``ip6tables-restore`` for IPv6) and must be printed
back as ``iptables-save`` / ``ip6tables-save`` 1.8.9 print it (ICMP type names as numbers,
``--reject-with`` abbreviations spelt out, ``[addr]`` brackets only with a port, ``-m state``
states upper case); each rule of :data:`REFUSED` must be refused, loading nothing. On the
emulator the refusal names the line and says why (the word in the table); the real tools' words
differ between the nf_tables and legacy backends and are not compared. The Linux executor
restores into a namespace made for the module (deleted after), flushing after every case.
"""

from __future__ import annotations

import re

import pytest

from tests.kernel.conftest import Executor
from tests.kernel.restore import Restorer

KERNEL_TOOLS = ("iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save", "iptables", "ip6tables")

HEADERS = {
    "filter": ":INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
    "nat": ":PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
    "mangle": ":PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
    "raw": ":PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
}

#: (version, table, rule as loaded, rule as iptables-save / ip6tables-save prints it back).
# fmt: off
ACCEPTED = [
    (6, "filter", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 128 -j ACCEPT", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 128 -j ACCEPT"),
    (6, "filter", "-A INPUT -p ipv6-icmp -m icmp6 ! --icmpv6-type neighbour-solicitation -j ACCEPT", "-A INPUT -p ipv6-icmp -m icmp6 ! --icmpv6-type 135 -j ACCEPT"),
    (6, "filter", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 1/4 -j ACCEPT", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 1/4 -j ACCEPT"),
    (6, "filter", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type port-unreachable -j ACCEPT", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 1/4 -j ACCEPT"),
    (6, "filter", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type destination-unreachable -j ACCEPT", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 1 -j ACCEPT"),
    (6, "filter", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 255 -j ACCEPT", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type 255 -j ACCEPT"),
    (4, "filter", "-A INPUT -p icmp -m icmp --icmp-type echo-request -j ACCEPT", "-A INPUT -p icmp -m icmp --icmp-type 8 -j ACCEPT"),
    (4, "filter", "-A INPUT -p icmp -m icmp ! --icmp-type ECHO-REQ -j ACCEPT", "-A INPUT -p icmp -m icmp ! --icmp-type 8 -j ACCEPT"),
    (4, "filter", "-A INPUT -p icmp -m icmp --icmp-type port-unreachable -j ACCEPT", "-A INPUT -p icmp -m icmp --icmp-type 3/3 -j ACCEPT"),
    (4, "filter", "-A INPUT -p icmp -m icmp --icmp-type 255 -j ACCEPT", "-A INPUT -p icmp -m icmp --icmp-type any -j ACCEPT"),
    (4, "filter", "-A INPUT -p icmp -m icmp --icmp-type 0x08 -j ACCEPT", "-A INPUT -p icmp -m icmp --icmp-type 8 -j ACCEPT"),
    (4, "filter", "-A INPUT -p icmp -m icmp --icmp-type 010 -j ACCEPT", "-A INPUT -p icmp -m icmp --icmp-type 8 -j ACCEPT"),
    (4, "filter", "-A INPUT -p tcp -j REJECT --reject-with tcp", "-A INPUT -p tcp -j REJECT --reject-with tcp-reset"),
    (4, "filter", "-A INPUT -p tcp -j REJECT --reject-with TCP-RESET", "-A INPUT -p tcp -j REJECT --reject-with tcp-reset"),
    (4, "filter", "-A INPUT -j REJECT --reject-with icmp", "-A INPUT -j REJECT --reject-with icmp-net-unreachable"),
    (4, "filter", "-A INPUT -j REJECT --reject-with host", "-A INPUT -j REJECT --reject-with icmp-host-unreachable"),
    (4, "filter", "-A INPUT -j REJECT --reject-with PORT", "-A INPUT -j REJECT --reject-with icmp-port-unreachable"),
    (6, "filter", "-A INPUT -j REJECT --reject-with icmp6", "-A INPUT -j REJECT --reject-with icmp6-no-route"),
    (6, "filter", "-A INPUT -j REJECT --reject-with ADDR", "-A INPUT -j REJECT --reject-with icmp6-addr-unreachable"),
    (4, "nat", "-A PREROUTING -p tcp -j DNAT --to-destination :1000", "-A PREROUTING -p tcp -j DNAT --to-destination :1000"),
    (4, "nat", "-A POSTROUTING -p tcp -j SNAT --to-source :1000-2000", "-A POSTROUTING -p tcp -j SNAT --to-source :1000-2000"),
    (4, "nat", "-A POSTROUTING -p icmp -j SNAT --to-source 192.0.2.1:2000", "-A POSTROUTING -p icmp -j SNAT --to-source 192.0.2.1:2000"),
    (4, "nat", "-A POSTROUTING ! -p tcp -j SNAT --to-source 192.0.2.1:2000", "-A POSTROUTING ! -p tcp -j SNAT --to-source 192.0.2.1:2000"),
    (4, "filter", "-A INPUT -m state --state new,ESTABLISHED", "-A INPUT -m state --state NEW,ESTABLISHED"),
    (6, "nat", "-A POSTROUTING -p tcp -j SNAT --to-source [2001:db8::1]", "-A POSTROUTING -p tcp -j SNAT --to-source 2001:db8::1"),
    (6, "nat", "-A PREROUTING -p tcp -j DNAT --to-destination [::1]", "-A PREROUTING -p tcp -j DNAT --to-destination ::1"),
    (6, "nat", "-A POSTROUTING -p tcp -j SNAT --to-source [2001:db8::1]:2000-2005", "-A POSTROUTING -p tcp -j SNAT --to-source [2001:db8::1]:2000-2005"),
]

#: (version, table, rule iptables-restore refuses, a word of the emulator's message).
REFUSED = [
    (4, "mangle", "-A INPUT -j REJECT", "filter table"),
    (4, "nat", "-A PREROUTING -j REJECT", "filter table"),
    (4, "raw", "-A PREROUTING -j REJECT", "filter table"),
    (6, "mangle", "-A INPUT -j REJECT", "filter table"),
    (4, "filter", "-A INPUT -j REJECT --reject-with tcp-reset", "needs -p tcp"),
    (4, "filter", "-A INPUT -p udp -j REJECT --reject-with tcp-reset", "needs -p tcp"),
    (4, "filter", "-A INPUT ! -p tcp -j REJECT --reject-with tcp-reset", "needs -p tcp"),
    (6, "filter", "-A INPUT -j REJECT --reject-with tcp-reset", "needs -p tcp"),
    (4, "filter", "-A INPUT -j REJECT --reject-with echo-reply", "no longer supported"),
    (6, "filter", "-A INPUT -j REJECT --reject-with icmp-port-unreachable", "unknown reject type"),
    (4, "nat", "-A POSTROUTING -j SNAT --to-source 192.0.2.1:2000", "Need TCP, UDP, SCTP or DCCP"),
    (4, "nat", "-A POSTROUTING -j MASQUERADE --to-ports 2000", "Need TCP, UDP, SCTP or DCCP"),
    (4, "nat", "-A PREROUTING -j REDIRECT --to-ports 2000", "Need TCP, UDP, SCTP or DCCP"),
    (4, "nat", "-A PREROUTING -j DNAT --to-destination :1000", "Need TCP, UDP, SCTP or DCCP"),
    (6, "nat", "-A POSTROUTING -p ipv6-icmp -j SNAT --to-source [2001:db8::1]:2000", "Need TCP, UDP, SCTP or DCCP"),
    (4, "filter", "-A INPUT -m state --state SNAT", "Bad state"),
    (4, "filter", "-A INPUT -p icmp -m icmp --icmp-type echo-re", "Ambiguous"),
    (4, "filter", "-A INPUT -p icmp -m icmp --icmp-type 256", "invalid ICMP type"),
    (6, "filter", "-A INPUT -p ipv6-icmp -m icmp6 --icmpv6-type neighbo", "Ambiguous"),
    (6, "filter", "-A INPUT -p ipv6-icmp -m icmp --icmp-type 8", "Couldn't load match"),
]
# fmt: on


def restore_text(table: str, rule: str) -> str:
    """One table with its built-in chains and ``rule`` (several lines allowed)."""
    return f"*{table}\n{HEADERS[table]}{rule}\nCOMMIT\n"


@pytest.mark.parametrize(("version", "table", "rule", "saved"), ACCEPTED)
def test_accepted_rules_save_as_iptables_save_prints_them(
    restorers: list[Restorer], version: int, table: str, rule: str, saved: str
) -> None:
    """A rule iptables-restore loads is loaded, and saved as iptables-save prints it."""
    for restorer in restorers:
        got = restorer.restore(restore_text(table, rule), version=version)
        assert got.loaded, f"{restorer.name}: {got.error}"
        assert got.rules == (saved,), restorer.name


@pytest.mark.parametrize(("version", "table", "rule", "message"), REFUSED)
def test_refused_rules_fail_the_load(
    executor: Executor, restorers: list[Restorer], version: int, table: str, rule: str, message: str
) -> None:
    """A rule iptables-restore refuses fails the load; the emulator names the line and the reason."""
    text = restore_text(table, rule)
    for restorer in restorers:
        got = restorer.restore(text, version=version)
        assert not got.loaded, f"{restorer.name} loaded it: {got.rules}"
        if executor is Executor.EMULATED:
            assert got.line == text.splitlines().index(rule) + 1
            assert re.search(f"line {got.line}: .*{message}", got.error), got.error


def test_icmp6_save_output_loads_back(restorers: list[Restorer]) -> None:
    """ip6tables-save's output for the icmp6 rules loads again and saves unchanged (no ``-m icmp``)."""
    rules = "\n".join(rule for version, _, rule, _ in ACCEPTED[:6] if version == 6)
    for restorer in restorers:
        once = restorer.restore(restore_text("filter", rules), version=6)
        assert once.loaded and not any("-m icmp " in r for r in once.rules), once
        again = restorer.restore(restore_text("filter", "\n".join(once.rules)), version=6)
        assert again.rules == once.rules, restorer.name
