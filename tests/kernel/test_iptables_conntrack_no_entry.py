# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""``-m conntrack`` on packets without a conntrack entry (INVALID, UNTRACKED) and with one,
on the emulated kernel and on Linux: each rule counts exactly the packets ``conntrack_mt`` holds for.

The kernel's match is ``conntrack_mt`` (net/netfilter/xt_conntrack.c): it looks at
``--ctstate`` first (INVALID when ``nf_ct_get`` gave no entry, UNTRACKED after
``CT --notrack``), and then, with no entry, returns ``info->match_flags & XT_CONNTRACK_STATE``:
without an entry only ``--ctstate`` counts, every other option, negated or not, is skipped.
:data:`CASES` says, per option set, whether it holds for each kind of packet.

On Linux: two namespaces made here, joined by a veth pair named ``eth0`` on both sides: a node
(192.168.0.2/24, default route via 192.168.0.1, ``nf_conntrack_tcp_loose=0``) and a client
(192.168.0.1/24, and 203.0.113.2/32 to send from); the emulator's node is
:func:`node_model`. The client sends, from 203.0.113.2:

- a UDP datagram to port 9001, which the node's raw PREROUTING makes UNTRACKED (``CT --notrack``);
- a TCP ACK to port 9002 with no entry, written on a raw socket: with ``tcp_loose`` off
  ``tcp_new`` refuses it, so it is INVALID (``skb->_nfct`` stays 0);
- a UDP datagram to port 9003 that a server on the node echoes: NEW with an entry on the way
  in, ESTABLISHED in the REPLY direction on the way out.

The emulator gets the same packets in the same order. The node counts them with
``-m conntrack`` rules for every case of :data:`CASES` in mangle PREROUTING and filter INPUT,
plus raw PREROUTING and raw OUTPUT rules (before conntrack: no entry yet) and mangle OUTPUT
rules for the echo; filter INPUT finally drops 9001 and 9002 (so the node answers neither with
an ICMP error nor a RST). Checked on each executor: the counts of ``iptables-save -c`` are
those the table says ``conntrack_mt`` gives; on Linux, every rule line (text and counters)
also equals the emulator's ``save(counters=True)``. And ``! --ctdir`` and a conntrack match
without options are refused by both.

Only traffic between these two namespaces is sent; both are deleted afterwards.
"""

from __future__ import annotations

import random
import socket
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import pytest

from emulation.clock import ManualClock
from emulation.netfilter import Netns, load
from emulation.node import Interface, Node, Route
from emulation.packet import Packet
from tests.emulation.test_conntrack_match_no_entry import CASES, CLIENT, KINDS
from tests.kernel.conftest import Executor
from tests.kernel.harness import parse_counters
from tests.kernel.netns import cleanup_stale, netns, sh
from tests.kernel.restore import Restorer

KERNEL_TOOLS = ("iptables-restore", "iptables-save", "sysctl")

NODE_IP = "192.168.0.2"


def node_model() -> Node:
    """The node as the emulator sees it: ``eth0`` 192.168.0.2/24, default route via 192.168.0.1,
    ``nf_conntrack_tcp_loose`` off."""
    return Node(
        interfaces=(Interface(name="eth0", addresses=(f"{NODE_IP}/24",)),),
        routes=(Route(destination="default", device="eth0", via="192.168.0.1"),),
        tcp_loose=False,
    )


def _from_client(**kw: object) -> Packet:
    return Packet(src=CLIENT, dst=NODE_IP, in_interface="eth0", **kw)  # type: ignore[arg-type]


#: The three packets, by kind: no entry (INVALID, UNTRACKED) and a new flow's (an entry).
PACKETS: dict[str, Packet] = {
    "invalid": _from_client(protocol="tcp", sport=40002, dport=9002, syn=False, length=40),
    "untracked": _from_client(protocol="udp", sport=40001, dport=9001, length=44),
    "entry": _from_client(protocol="udp", sport=40003, dport=9003, length=44),
}

# fmt: off
#: ``(options, matches INVALID, matches UNTRACKED, matches the new flow's packet)``: what
#: ``conntrack_mt`` returns. The new flow's entry: original (203.0.113.2, 40003 -> 192.168.0.2,
#: 9003), reply (192.168.0.2, 9003 -> 203.0.113.2, 40003), no NAT, direction ORIGINAL.
# fmt: on


GATEWAY = "192.168.0.1"
PAYLOAD = b"x" * 16  # 20 + 8 + 16 = 44 bytes, the length of the emulated UDP packets
#: ``-p PROTO -m PROTO --dport PORT`` of each kind of packet, as iptables-save writes it.
SELECT = {
    "untracked": "-p udp -m udp --dport 9001",
    "invalid": "-p tcp -m tcp --dport 9002",
    "entry": "-p udp -m udp --dport 9003",
}
ECHO = f"-d {CLIENT}/32 -p udp -m udp --sport 9003"
#: The options of raw PREROUTING's rules before the notrack rule, and after it.
RAW_BEFORE = ("--ctstate INVALID", "--ctstate NEW", "--ctdir ORIGINAL", "! --ctorigsrc 10.0.0.0/8")
RAW_AFTER = ("--ctstate UNTRACKED", "--ctstate INVALID")
#: ``(options, packets)`` of raw OUTPUT and mangle OUTPUT rules for the node's echo.
RAW_OUT = (("--ctstate INVALID", 1), ("--ctdir REPLY", 0))
MANGLE_OUT = (
    ("--ctstate ESTABLISHED --ctorigsrc 203.0.113.2 --ctreplsrcport 9003 --ctdir REPLY", 1),
    ("--ctdir ORIGINAL", 0),
    ("! --ctstate INVALID,UNTRACKED", 1),
)


def _canonical(options: str) -> str:
    """The options as iptables-save prints them (``--ctdir`` last); the emulator's save agrees."""
    return " ".join(
        load(f"*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m conntrack {options}\nCOMMIT\n")
        .rules()[0][1]
        .matches[0]
        .save_args()
    )


def rules() -> str:
    """The node's rules (see the module docstring), as iptables-restore input."""
    src = f"-s {CLIENT}/32"
    raw = [f"-A PREROUTING {src} {SELECT[k]} -m conntrack {_canonical(o)}" for o in RAW_BEFORE for k in KINDS]
    raw.append(f"-A PREROUTING {src} {SELECT['untracked']} -j CT --notrack")
    raw += [f"-A PREROUTING {src} {SELECT[k]} -m conntrack {_canonical(o)}" for o in RAW_AFTER for k in KINDS]
    raw += [f"-A OUTPUT {ECHO} -m conntrack {_canonical(o)}" for o, _ in RAW_OUT]
    per_case = [f"{src} {SELECT[k]} -m conntrack {_canonical(c[0])}" for c in CASES for k in KINDS]
    mangle = [f"-A PREROUTING {r}" for r in per_case] + [
        f"-A OUTPUT {ECHO} -m conntrack {_canonical(o)}" for o, _ in MANGLE_OUT
    ]
    filter_ = [f"-A INPUT {r}" for r in per_case]
    filter_ += [
        f"-A INPUT {src} {SELECT['untracked']} -j DROP",
        f"-A INPUT {src} {SELECT['invalid']} -j DROP",
    ]
    return (
        "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n" + "\n".join(raw) + "\nCOMMIT\n"
        "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n"
        + "\n".join(mangle) + "\nCOMMIT\n"
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n" + "\n".join(filter_) + "\nCOMMIT\n"
    )  # fmt: skip


def tcp_ack(src: str, dst: str, sport: int, dport: int) -> bytes:
    """A 20-byte TCP header with only ACK set and a valid checksum (RFC 793 pseudo-header)."""
    header = struct.pack("!HHIIBBHHH", sport, dport, 1000, 2000, 5 << 4, 0x10, 1024, 0, 0)
    pseudo = (
        socket.inet_aton(src)
        + socket.inet_aton(dst)
        + struct.pack("!BBH", 0, socket.IPPROTO_TCP, len(header))
    )
    data = pseudo + header
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return header[:16] + struct.pack("!H", ~total & 0xFFFF) + header[18:]


def test_tcp_ack_checksum_is_the_internet_checksum() -> None:
    """Summing the pseudo-header and the finished segment gives 0xFFFF, as a receiver checks it."""
    segment = tcp_ack(CLIENT, NODE_IP, 40002, 9002)
    data = socket.inet_aton(CLIENT) + socket.inet_aton(NODE_IP) + struct.pack("!BBH", 0, 6, 20) + segment
    total = sum(struct.unpack("!16H", data))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    assert total == 0xFFFF and segment[13] == 0x10


_SERVER = textwrap.dedent(f"""
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("{NODE_IP}", 9003))
    print("ready", flush=True)
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
""")

_CLIENT = textwrap.dedent(f"""
    import socket, sys
    untracked = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); untracked.bind(("{CLIENT}", 40001))
    untracked.sendto({PAYLOAD!r}, ("{NODE_IP}", 9001))
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP); raw.bind(("{CLIENT}", 0))
    raw.sendto(bytes.fromhex(sys.argv[1]), ("{NODE_IP}", 0))
    flow = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); flow.bind(("{CLIENT}", 40003))
    flow.settimeout(5)
    flow.sendto({PAYLOAD!r}, ("{NODE_IP}", 9003))
    assert flow.recvfrom(2048)[0] == {PAYLOAD!r}
""")


@dataclass(frozen=True, slots=True)
class Pair:
    """The namespaces' real names."""

    node: str
    client: str


def _restore(ns: str, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "iptables-restore"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
    )


@contextmanager
def _pair() -> Iterator[Pair]:
    """The node and client namespaces, linked (deleted after)."""
    cleanup_stale()
    with ExitStack() as stack:
        node, client = stack.enter_context(netns("ctnode")), stack.enter_context(netns("ctclient"))
        sh(
            "ip",
            "link",
            "add",
            "eth0",
            "netns",
            node,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            client,
        )
        sh("ip", "-n", node, "addr", "add", f"{NODE_IP}/24", "dev", "eth0")
        sh("ip", "-n", client, "addr", "add", f"{GATEWAY}/24", "dev", "eth0")
        sh("ip", "-n", client, "addr", "add", f"{CLIENT}/32", "dev", "eth0")
        for ns in (node, client):
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", node, "route", "add", "default", "via", GATEWAY)
        yield Pair(node, client)


def _start_server(stack: ExitStack, ns: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _SERVER],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

    def stop() -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)

    stack.callback(stop)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"echo server did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc


def _kernel_counters(pair: Pair) -> str:
    """``iptables-save -c`` of the node once both DROP rules at the end of INPUT counted their packet."""
    text = ""
    drops = len(CASES) * len(KINDS) + 1
    for _ in range(50):
        text = sh("ip", "netns", "exec", pair.node, "iptables-save", "-c").stdout
        counters = parse_counters(text)
        if counters[("filter", "INPUT", drops)][0] == 1 and counters[("filter", "INPUT", drops + 1)][0] == 1:
            return text
        time.sleep(0.1)
    raise AssertionError(f"the kernel never counted both dropped packets:\n{text}")


def _emulate() -> Netns:
    """The emulator after the same packets, in the same order."""
    ns = Netns(node_model(), ManualClock())
    ns.restore(rules())
    for kind in ("untracked", "invalid", "entry"):
        ns.send(PACKETS[kind], random.Random(1))
    echo = Packet(src=NODE_IP, dst=CLIENT, sport=9003, dport=40003, protocol="udp", length=44)
    assert ns.send(echo, random.Random(1)).ctstate == "ESTABLISHED"
    return ns


def _linux(pair: Pair) -> str:
    """The node's ``iptables-save -c`` after the client sent the packets for real."""
    loaded = _restore(pair.node, rules())
    assert loaded.returncode == 0, loaded.stderr
    sh("ip", "netns", "exec", pair.node, "sysctl", "-q", "-w", "net.netfilter.nf_conntrack_tcp_loose=0")
    with ExitStack() as stack:
        server = _start_server(stack, pair.node)
        ack = tcp_ack(CLIENT, NODE_IP, PACKETS["invalid"].sport, PACKETS["invalid"].dport)
        sent = subprocess.run(["ip", "netns", "exec", pair.client, sys.executable, "-c", _CLIENT, ack.hex()],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        server.wait(timeout=10)
    return _kernel_counters(pair)


@pytest.fixture(scope="module")
def counted(executor: Executor) -> Iterator[str]:
    """``iptables-save -c`` of the node after the packets, on the executor."""
    if executor is Executor.EMULATED:
        yield _emulate().save(counters=True)
        return
    with _pair() as pair:
        yield _linux(pair)


def _rule_lines(save: str) -> list[str]:
    return [line for line in save.splitlines() if line.startswith(("[", "*"))]


def test_each_rule_counts_what_conntrack_mt_holds_for(counted: str) -> None:
    """The per-case rules of mangle PREROUTING and filter INPUT, and the raw and OUTPUT rules, count the table's packets."""
    counters = parse_counters(counted)
    want = {k: [c[1 + KINDS.index(k)] for c in CASES] for k in KINDS}
    for chain in (("mangle", "PREROUTING"), ("filter", "INPUT")):
        got = {
            k: [counters[(*chain, 1 + i * len(KINDS) + KINDS.index(k))][0] == 1 for i in range(len(CASES))]
            for k in KINDS
        }
        assert got == want, chain
    raw = [counters[("raw", "PREROUTING", i)][0] for i in range(1, len(RAW_BEFORE) * len(KINDS) + 2)]
    # Before conntrack every packet is INVALID: only "--ctstate INVALID" and nothing else counts.
    assert raw == [1, 1, 1] + [0] * 9 + [1]
    after = [counters[("raw", "PREROUTING", len(raw) + 1 + i)][0] for i in range(len(RAW_AFTER) * len(KINDS))]
    # UNTRACKED at once for 9001 (xt_ct_target), still INVALID for the rest.
    assert after == [int(k == "untracked") for k in KINDS] + [int(k != "untracked") for k in KINDS]
    assert [counters[("raw", "OUTPUT", 1 + i)][0] for i in range(len(RAW_OUT))] == [n for _, n in RAW_OUT]
    assert [counters[("mangle", "OUTPUT", 1 + i)][0] for i in range(len(MANGLE_OUT))] == [n for _, n in MANGLE_OUT]


def test_kernel_save_lines_equal_the_emulators(executor: Executor, counted: str) -> None:
    """Every rule line of the kernel's ``iptables-save -c`` (text and counters) equals the emulator's (Linux only)."""
    if executor is not Executor.LINUX:
        pytest.skip("compares the real kernel's save with the emulator's")
    assert _rule_lines(_emulate().save(counters=True)) == _rule_lines(counted)


@pytest.mark.parametrize(("rule", "message"), [("-m conntrack ! --ctdir REPLY", 'option "--ctdir" cannot be inverted'),
                                               ("-m conntrack", "At least one option is required")])  # fmt: skip
def test_iptables_refuses_what_it_cannot_express(
    executor: Executor, restorers: list[Restorer], rule: str, message: str
) -> None:
    """``! --ctdir`` (no ``XTOPT_INVERT``) and a bare ``-m conntrack`` (``conntrack_mt_check``) do not load."""
    text = f"*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT {rule}\nCOMMIT\n"
    for restorer in restorers:
        got = restorer.restore(text, version=4)
        assert not got.loaded, restorer.name
        if restorer.name == "linux":
            assert message in got.error, got.error
