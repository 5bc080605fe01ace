# ruff: noqa: E501  (the ruleset literal and the packet line are kept whole to stay readable)
"""``reject`` and its types: the answer the emulator names is the one the kernel sends.

A client namespace connects (TCP) or sends on a connected socket (UDP) to a node namespace whose
``inet`` input chain rejects each port with another type. The error the client's socket gets
(``ECONNREFUSED`` for a TCP reset or a port unreachable, ``EHOSTUNREACH`` for admin-prohibited and
host-unreachable, ``ENETUNREACH`` for net-unreachable; ``IP_RECVERR`` on, so UDP reports the soft
errors too) is what the emulator's named answer means.
"""

from __future__ import annotations

import errno
import random
import subprocess
from collections.abc import Iterator

import pytest

from emulation import Interface, ManualClock, Node, Packet, Route
from emulation.nftables import Netns
from emulation.nftables.netns import reject_answer
from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns, sh, veth

pytestmark = pytest.mark.kernel

NODE_IP, CLIENT_IP = "10.99.0.1", "10.99.0.2"
#: port -> (protocol, reject statement)
PORTS = {
    7001: ("tcp", "reject"),
    7002: ("tcp", "reject with tcp reset"),
    7003: ("tcp", "reject with icmpx admin-prohibited"),
    7004: ("udp", "reject"),
    7005: ("udp", "reject with icmpx host-unreachable"),
    7006: ("tcp", "reject with icmp type net-unreachable"),
}
_HEAD = "table inet t {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n"
RULES = _HEAD + "".join(f"\t\t{proto} dport {port} {stmt}\n" for port, (proto, stmt) in PORTS.items()) + "\t}\n}\n"
#: What a client socket reports for each answer.
ERRNO = {"tcp reset": errno.ECONNREFUSED, "icmp port-unreachable": errno.ECONNREFUSED,
         "icmp admin-prohibited": errno.EHOSTUNREACH, "icmp host-unreachable": errno.EHOSTUNREACH,
         "icmp net-unreachable": errno.ENETUNREACH}

CLIENT = """\
import socket, sys
port, proto = int(sys.argv[1]), sys.argv[2]
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
s.settimeout(3)
s.setsockopt(socket.IPPROTO_IP, 11, 1)  # IP_RECVERR: UDP reports soft ICMP errors (host-unreachable) too
try:
    s.connect(("10.99.0.1", port))
    if proto == "udp":
        s.send(b"x")
        s.recv(10)
    print(0)
except OSError as err:
    print(err.errno or -1)
"""


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[str, str]]:
    require_kernel("nft")
    cleanup_stale()
    with netns("rejnode") as node_ns, netns("rejcli") as client_ns:
        veth(node_ns, f"{NODE_IP}/24", client_ns, f"{CLIENT_IP}/24", "rej")
        done = subprocess.run(["ip", "netns", "exec", node_ns, "nft", "-f", "-"], input=RULES, text=True,
                              capture_output=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        yield node_ns, client_ns


def _emulated() -> Netns:
    node = Node(interfaces=(Interface(name="eth0", addresses=(f"{NODE_IP}/24",)),),
                routes=(Route(destination="10.99.0.0/24", device="eth0"),))
    netns = Netns(node, ManualClock())
    netns.apply(RULES)
    return netns


@pytest.mark.parametrize("port", sorted(PORTS))
def test_reject_answer_is_what_the_kernel_sends(node: tuple[str, str], port: int) -> None:
    """The emulator rejects the packet naming an answer; the kernel's answer gives the client that error."""
    proto, _ = PORTS[port]
    outcome = _emulated().send(Packet(src=CLIENT_IP, dst=NODE_IP, sport=40000, dport=port, protocol=proto,  # type: ignore[arg-type]
                                      in_interface="eth0"), random.Random(0))
    assert outcome.verdict == "REJECT"
    answer = outcome.reason.rsplit("answered with ", 1)[1]
    got = sh("ip", "netns", "exec", node[1], "python3", "-c", CLIENT, str(port), proto).stdout.strip()
    assert int(got) == ERRNO[answer], (answer, got)


def test_reject_answers_by_family() -> None:
    """A plain reject and icmpx codes answer in the packet's own ICMP family; tcp reset only TCP."""
    assert reject_answer("default", 4, "tcp") == "icmp port-unreachable"
    assert reject_answer("default", 6, "udp") == "icmpv6 port-unreachable"
    assert reject_answer("icmpx admin-prohibited", 6, "tcp") == "icmpv6 admin-prohibited"
    assert reject_answer("icmpx no-route", 4, "udp") == "icmp net-unreachable"
    assert reject_answer("tcp reset", 4, "tcp") == "tcp reset"
