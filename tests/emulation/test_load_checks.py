# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)

"""Load checks the emulator alone needs: what a loaded rule then matches or writes. The accepted
and refused load cases and their saved text are one suite on both executors, in
tests/kernel/test_iptables_load_checks.py.
"""

from __future__ import annotations

import random

from .helpers import netns, pkt

HEADERS = {
    "filter": ":INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
    "nat": ":PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
    "mangle": ":PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
    "raw": ":PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
}


def restore_text(table: str, rule: str) -> str:
    """One table with its built-in chains and ``rule``."""
    return f"*{table}\n{HEADERS[table]}{rule}\nCOMMIT\n"


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
