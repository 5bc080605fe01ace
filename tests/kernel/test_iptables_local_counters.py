# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""The emulator against the real kernel: same save text, same counters for deterministic rules.

Each test builds its own network namespace (``tests.kernel.netns``), loads rules with the real
``iptables-restore``, sends UDP datagrams to an address on the namespace's ``lo``, and compares
``iptables-save -c`` with what the emulator predicts for the same packets.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from emulation.clock import ManualClock
from emulation.netfilter import Netns, load, save
from emulation.node import Interface, Node
from emulation.packet import Packet
from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns, sh

pytestmark = pytest.mark.kernel

ADDR = "10.1.0.1"
RULES = """*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A OUTPUT -p udp -m udp --dport 9000 -m comment --comment "raw sees every packet" -j LOG --log-prefix "kproxy-test "
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A OUTPUT -p udp --dport 9000 -j MARK --set-mark 0x4000
-A INPUT -p udp -m mark --mark 0x4000/0x4000 -m udp --dport 9000
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:SVC - [0:0]
-A OUTPUT -d 10.1.0.1/32 -p udp -m udp --dport 9000 -j SVC
-A SVC -m statistic --mode nth --every 2 --packet 0 -j RETURN
-A SVC -p udp -m conntrack --ctstate NEW
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:COUNT - [0:0]
-A INPUT -p udp -m udp --dport 9000 -m conntrack --ctstate NEW -j COUNT
-A INPUT -p udp -m udp --dport 9000 -m conntrack --ctstate ESTABLISHED -j COUNT
-A INPUT -p udp -m multiport --dports 8999,9000 -m statistic --mode nth --every 3 --packet 2
-A OUTPUT -p udp -m udp --dport 9000 -m addrtype --dst-type LOCAL -j ACCEPT
-A COUNT -m recent --set --name SEEN --rsource
-A COUNT -p udp -m udp --sport 7001 -j RETURN
COMMIT
"""
#: (source port, payload bytes) of each datagram, in sending order: two flows.
SENDS = [(7001, 10), (7001, 20), (7002, 30), (7001, 40), (7002, 50)]


def _strip(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line and not line.startswith("#")) + "\n"


@pytest.fixture
def ns() -> object:
    require_kernel("iptables-restore", "iptables-save")
    cleanup_stale()
    with netns("nf") as name:
        sh("ip", "-n", name, "addr", "add", f"{ADDR}/32", "dev", "lo")
        yield name


def _restore(ns_name: str, text: str, *args: str) -> None:
    import subprocess

    proc = subprocess.run(
        ["ip", "netns", "exec", ns_name, "iptables-restore", *args],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"iptables-restore failed: {proc.stderr}")


def _save(ns_name: str, *args: str) -> str:
    return _strip(sh("ip", "netns", "exec", ns_name, "iptables-save", *args).stdout)


def test_kernel_save_round_trips_through_the_parser(ns: str) -> None:
    """The kernel's iptables-save of our rules equals the emulator's save of the same input."""
    _restore(ns, RULES)
    real = _save(ns)
    assert save(load(RULES)) == real
    assert save(load(real)) == real


def test_counters_match_the_kernel_after_real_packets(ns: str) -> None:
    """After real UDP datagrams, every counter of iptables-save -c equals the emulator's prediction."""
    _restore(ns, RULES)
    code = textwrap.dedent(f"""
        import socket
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind(("{ADDR}", 9000))
        socks = {{}}
        for sport, size in {SENDS!r}:
            if sport not in socks:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("{ADDR}", sport)); socks[sport] = s
            socks[sport].sendto(b"x" * size, ("{ADDR}", 9000))
            rx.settimeout(5); rx.recvfrom(2048)
    """)
    sh("ip", "netns", "exec", ns, sys.executable, "-c", code)
    real = _save(ns, "-c")

    emu = Netns(
        Node(interfaces=(Interface(name="lo", addresses=("127.0.0.1/8", f"{ADDR}/32")),)), ManualClock()
    )
    emu.restore(RULES)
    import random

    rng = random.Random(0)
    for sport, size in SENDS:
        out = emu.send(
            Packet(src=ADDR, dst=ADDR, sport=sport, dport=9000, protocol="udp", length=28 + size), rng
        )
        assert out.verdict == "ACCEPT" and out.delivery == "local"
    predicted = emu.save(counters=True)
    rule_lines = [line for line in real.splitlines() if line.startswith("[")]
    assert [line for line in predicted.splitlines() if line.startswith("[")] == rule_lines
    assert predicted == real
