# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Load checks and save text: each case is what iptables-restore 1.8.9 and
ip6tables-save print for the same input (tests/kernel/test_iptables_load_checks.py loads the
same texts into the real kernel).
"""

from __future__ import annotations

import random

import pytest

from emulation.errors import NetfilterError
from emulation.netfilter import load, save

from .helpers import netns, pkt

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
    """One table with its built-in chains and ``rule``."""
    return f"*{table}\n{HEADERS[table]}{rule}\nCOMMIT\n"


def saved_rules(text: str) -> list[str]:
    """The ``-A`` lines of a save text."""
    return [line for line in text.splitlines() if line.startswith("-A")]


@pytest.mark.parametrize(("version", "table", "rule", "saved"), ACCEPTED)
@pytest.mark.parametrize("strict", [True, False])
def test_accepted_rules_save_as_iptables_save_prints_them(
    version: int, table: str, rule: str, saved: str, strict: bool
) -> None:
    """A rule iptables-restore loads is loaded, and saved as iptables-save prints it."""
    assert saved_rules(save(load(restore_text(table, rule), version=version, strict=strict))) == [saved]


@pytest.mark.parametrize(("version", "table", "rule", "message"), REFUSED)
@pytest.mark.parametrize("strict", [True, False])
def test_refused_rules_fail_the_load_naming_the_line(
    version: int, table: str, rule: str, message: str, strict: bool
) -> None:
    """A rule iptables-restore refuses fails the load, strict or lenient, naming its line."""
    text = restore_text(table, rule)
    line = text.splitlines().index(rule) + 1
    with pytest.raises(NetfilterError, match=f"line {line}: .*{message}"):
        load(text, version=version, strict=strict)


def test_icmp6_save_output_loads_back() -> None:
    """The user's icmp6 ruleset saves to text the emulator (and ip6tables-restore) loads again unchanged."""
    text = restore_text("filter", "\n".join(rule for version, _, rule, _ in ACCEPTED[:6] if version == 6))
    once = save(load(text, version=6))
    assert "-m icmp " not in once
    assert save(load(once, version=6, strict=True)) == once


def test_icmp_type_matches_only_the_emulated_echo_request() -> None:
    """The emulated ICMP packet is an echo request: type 8 / any match it, 3/3 and ! echo-request do not."""
    cases = {
        "8": True,
        "any": True,
        "echo-request": True,
        "8/0": True,
        "8/1": False,
        "3/3": False,
        "0": False,
    }
    for icmp_type, hit in cases.items():
        ns = netns(restore_text("filter", f"-A INPUT -p icmp -m icmp --icmp-type {icmp_type} -j DROP"))
        got = ns.send(pkt(protocol="icmp", sport=0, dport=0), random.Random(0)).verdict
        assert (got == "DROP") == hit, icmp_type


def test_dnat_to_a_port_alone_keeps_the_destination_address() -> None:
    """``DNAT --to-destination :8080`` changes the port only (no NF_NAT_RANGE_MAP_IPS)."""
    ns = netns(restore_text("nat", "-A PREROUTING -p tcp -j DNAT --to-destination :8080"))
    out = ns.send(pkt(), random.Random(0))
    assert out.destination == "192.168.0.2:8080"
