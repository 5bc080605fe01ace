# ruff: noqa: E501  (iptables rules and expectation messages are kept whole to stay readable)
"""The source port source NAT gives a new flow, on the emulated kernel and on Linux.

On Linux the namespaces are those of :func:`tests.kernel.harness.topology` (the emulator's
node is its mirror, :func:`tests.scenarios.node_model`): pods ``pa``, ``pb`` and ``pc`` behind
the node, the "external" side ``n2`` on the node's ``eth1`` (192.168.0.3, and 10.180.1.1 on its
``lo`` as a second external address), and the external client on ``eth0``. A test loads one
``iptables-restore`` text into the node namespace and into an emulated
:class:`~emulation.netfilter.Netns`, then sends UDP flows one after another from UDP sockets it
opens in the namespaces: a listener it opens in the destination namespace reads each datagram
and records the (address, port) it came from, which is what source NAT made of the flow. The
emulator gets the same packets in the same order (``Netns.send``) and must make the same choice;
where the kernel draws a port at random, the property is asserted (kept, or remapped into which
range), not the number. Each test is written once against a :class:`Lab` (sockets in the
namespaces, :class:`LinuxLab`, or the emulated node, :class:`EmulatedLab`) and runs on both. Where asked, the listener then answers every flow at the address and
port it saw, and the answer must reach the socket that sent the flow, as the emulator's
translation of the same reply must reach the same pod.

The kernel's choice is ``get_unique_tuple`` in net/netfilter/nf_nat_core.c (the emulator's
:mod:`emulation.netfilter.nat`): keep the flow's own source port when the reply tuple it would
get is free (``nf_nat_used_tuple``); else reuse the mapping of an earlier flow from the same
source (``find_appropriate_src``); else draw one (``nf_nat_l4proto_unique_tuple``: from a random
offset, in 1-511, 600-1023 or 1024-65535 as the original port is below 512, below 1024 or not,
or in ``--to-ports``). ``--random-fully`` skips the keeping. A flow whose reply tuple stays taken
is dropped when its conntrack entry is confirmed (``__nf_conntrack_confirm``).

Only traffic between the harness's namespaces is sent, each wait is bounded by :data:`WAIT_S`,
and the namespaces and sockets are removed after each test, also after a failure.
"""

from __future__ import annotations

import random
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Protocol

import pytest

from emulation import ManualClock, Packet
from emulation.netfilter import Netns, Outcome
from tests.kernel.conftest import Executor
from tests.kernel.harness import Topology, netns_socket, topology
from tests.kernel.netns import sh
from tests.scenarios import EXTERNAL, NODE2_IP, NODE_IP, PA, PB, POD_CLIENT, REMOTE, node_model

KERNEL_TOOLS = ("iptables-restore", "conntrack", "sysctl")

#: The listener ports: on n2's 192.168.0.3, on n2's second address 10.180.1.1, and in pod ``pa``
#: (8080 is taken there by the harness's identity server).
EXT_PORT, EXT2_PORT, POD_PORT = 9090, 9091, 9090
#: The source port two pods both send from.
SPORT = 40000
#: Two virtual addresses DNAT'ed to ``pa``'s listener (case 3), and the client's source port.
VIP_A, VIP_B, CLIENT_SPORT = "172.30.0.1", "172.30.0.2", 45000
#: How long to wait for a datagram that should arrive (they take milliseconds here).
WAIT_S = 2.0
#: The address each harness namespace sends from, and the node interface its packets arrive on.
SOURCE = {"pa": (PA, "vp1"), "pb": (PB, "vp2"), "pc": (POD_CLIENT, "vp3"), "client": (EXTERNAL, "eth0")}
#: Which namespace holds each listening address.
HOLDER = {NODE2_IP: "n2", REMOTE: "n2", PA: "pa"}

_NAT = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n{rules}COMMIT\n"
MASQUERADE = _NAT.format(rules="-A POSTROUTING -o eth1 -j MASQUERADE\n")
RANDOM_FULLY = _NAT.format(rules="-A POSTROUTING -o eth1 -j MASQUERADE --random-fully\n")
ONE_PORT = _NAT.format(rules=f"-A POSTROUTING -o eth1 -p udp -j SNAT --to-source {NODE_IP}:5000\n")
TWO_VIPS = _NAT.format(rules="".join(
    f"-A PREROUTING -d {vip}/32 -p udp -m udp --dport 80 -j DNAT --to-destination {PA}:{POD_PORT}\n"
    for vip in (VIP_A, VIP_B)))  # fmt: skip

Seen = tuple[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Flow:
    """One UDP flow: from ``ns`` (a harness key), its address, port ``sport``, to ``dst:dport``."""

    ns: str
    sport: int
    dst: str
    dport: int

    @property
    def src(self) -> str:
        """The address the namespace sends from."""
        return SOURCE[self.ns][0]

    @property
    def tag(self) -> bytes:
        """The datagram's payload, naming the flow."""
        return f"{self.ns} {self.src}:{self.sport} -> {self.dst}:{self.dport}".encode()


# -- the kernel ---------------------------------------------------------------------------------


def udp_socket(ns: str) -> socket.socket:
    """A UDP socket (``SO_REUSEADDR``) in the namespace named ``ns``."""
    s = netns_socket(ns, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return s


def _receive(sock: socket.socket, want: bytes) -> Seen | None:
    """The (address, port) the datagram ``want`` came from, or None when none came within
    :data:`WAIT_S`; any other datagram is an error (nothing else is sent to these sockets)."""
    sock.settimeout(WAIT_S)
    try:
        data, peer = sock.recvfrom(2048)
    except TimeoutError:
        return None
    assert data == want, f"expected {want!r}, got {data!r} from {peer}"
    return peer[0], peer[1]


class Lab(Protocol):
    """UDP flows through a node holding one ``iptables-restore`` text (see the module docstring)."""

    def listen(self, ip: str, port: int, *, via: Sequence[tuple[str, int]] = ()) -> None:
        """Listen on ``ip:port``; flows sent to the destinations ``via`` (DNAT'ed to it) arrive there too."""
        ...

    def send(self, flow: Flow) -> Seen | None:
        """Send the flow's first datagram: the source its listener saw, or None when it did not arrive."""
        ...

    def answer(self, flow: Flow, seen: Seen) -> bool:
        """The listener answers ``flow`` at ``seen``: whether the answer reached the flow's
        sender, from the address and port the flow was sent to."""
        ...

    def insert_failed(self) -> int:
        """How many flows' conntrack entries could not be confirmed (a taken reply tuple) so far."""
        ...


class LinuxLab:
    """UDP sockets in the harness's namespaces, all closed by :attr:`stack`: the listeners
    (by the destinations whose flows reach them) and one socket per flow sent."""

    def __init__(self, topo: Topology, stack: ExitStack, rules: str) -> None:
        self.topo = topo
        self.stack = stack
        self.listeners: dict[tuple[str, int], socket.socket] = {}
        self.senders: dict[Flow, socket.socket] = {}
        proc = subprocess.run(["ip", "netns", "exec", topo.names["node"], "iptables-restore"], input=rules,
                              text=True, capture_output=True, timeout=30)  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"iptables-restore failed ({proc.returncode}): {proc.stderr.strip()}\n{rules}")
        assert "0 flow entries" in self._conntrack("-L")
        self._failed_at_start = self.insert_failed()

    def _open(self, key: str) -> socket.socket:
        s = udp_socket(self.topo.names[key])
        self.stack.callback(s.close)
        return s

    def _conntrack(self, *args: str) -> str:
        proc = sh("ip", "netns", "exec", self.topo.names["node"], "conntrack", *args)
        return proc.stdout + proc.stderr

    def listen(self, ip: str, port: int, *, via: Sequence[tuple[str, int]] = ()) -> None:
        """Open the listener on ``ip:port`` in the namespace holding ``ip``."""
        s = self._open(HOLDER[ip])
        s.bind((ip, port))
        for dst in ((ip, port), *via):
            self.listeners[dst] = s

    def send(self, flow: Flow) -> Seen | None:
        """From a new socket bound to the flow's source and connected to its destination (kept
        open for the answer)."""
        assert flow not in self.senders, f"{flow} sent twice"
        s = self._open(flow.ns)
        s.bind((flow.src, flow.sport))
        s.connect((flow.dst, flow.dport))
        self.senders[flow] = s
        s.send(flow.tag)
        return _receive(self.listeners[(flow.dst, flow.dport)], flow.tag)

    def answer(self, flow: Flow, seen: Seen) -> bool:
        """The listener's socket sends the answer; the flow's socket must receive it."""
        reply = b"re: " + flow.tag
        self.listeners[(flow.dst, flow.dport)].sendto(reply, seen)
        return _receive(self.senders[flow], reply) == (flow.dst, flow.dport)

    def insert_failed(self) -> int:
        """The node's conntrack ``insert_failed`` statistic since the load, summed over CPUs
        (``conntrack -S``)."""
        fields = self._conntrack("-S").split()
        total = sum(int(f.partition("=")[2]) for f in fields if f.startswith("insert_failed="))
        return total - getattr(self, "_failed_at_start", 0)


class EmulatedLab:
    """The emulated node (:func:`tests.scenarios.node_model`) holding the same text; every
    datagram goes through ``Netns.send`` with one seeded generator, in the order sent."""

    def __init__(self, rules: str, seed: int) -> None:
        self.emu = Netns(node_model(), ManualClock())
        self.emu.restore(rules)
        self.rng = random.Random(seed)
        self.listeners: dict[tuple[str, int], Seen] = {}
        self.sent: dict[Flow, Outcome] = {}
        self.failed = 0

    def listen(self, ip: str, port: int, *, via: Sequence[tuple[str, int]] = ()) -> None:
        """Remember where flows to ``ip:port`` and ``via`` must arrive."""
        for dst in ((ip, port), *via):
            self.listeners[dst] = (ip, port)

    def send(self, flow: Flow) -> Seen | None:
        """The datagram as it arrives from its namespace; it must reach its listener when accepted."""
        src, iif = SOURCE[flow.ns]
        out = self.emu.send(Packet(src=src, dst=flow.dst, sport=flow.sport, dport=flow.dport, protocol="udp",
                                   in_interface=iif), self.rng)  # fmt: skip
        self.sent[flow] = out
        if out.verdict != "ACCEPT":
            self.failed += "conntrack confirmation fails" in out.reason
            return None
        assert (out.packet.dst, out.packet.dport) == self.listeners[(flow.dst, flow.dport)], out
        return out.packet.src, out.packet.sport

    def answer(self, flow: Flow, seen: Seen) -> bool:
        """The listener's answer, sent back where the datagram went out, as the node forwards it."""
        p = self.sent[flow].packet
        assert (p.src, p.sport) == seen
        back = self.emu.send(Packet(src=p.dst, dst=p.src, sport=p.dport, dport=p.sport, protocol="udp",
                                    in_interface=self.sent[flow].out_interface), self.rng)  # fmt: skip
        q = back.packet
        return (q.src, q.sport, q.dst, q.dport, back.out_interface) == (
            flow.dst, flow.dport, flow.src, flow.sport, SOURCE[flow.ns][1])  # fmt: skip

    def insert_failed(self) -> int:
        """Flows dropped because no source port left a free reply tuple."""
        return self.failed


def _remapped(port: int, original: int) -> bool:
    return port != original and 1024 <= port <= 65535


LabFactory = Callable[[str, Sequence[tuple[str, int]]], Lab]


@pytest.fixture
def lab(executor: Executor) -> Iterator[LabFactory]:
    """``lab(rules, listeners)``: a fresh node holding ``rules`` (no conntrack entry yet), with
    listeners open; on Linux a fresh harness (deleted after the test, sockets closed)."""
    if executor is Executor.EMULATED:
        seeds = iter(range(1, 100))
        yield lambda rules, listeners: _listening(EmulatedLab(rules, next(seeds)), listeners)
        return
    with topology() as topo, ExitStack() as stack:
        yield lambda rules, listeners: _listening(LinuxLab(topo, stack, rules), listeners)


def _listening(lab: Lab, listeners: Sequence[tuple[str, int]]) -> Lab:
    for ip, port in listeners:
        lab.listen(ip, port)
    return lab


# -- the cases ----------------------------------------------------------------------------------

A1 = Flow(ns="pa", sport=SPORT, dst=NODE2_IP, dport=EXT_PORT)
B1 = Flow(ns="pb", sport=SPORT, dst=NODE2_IP, dport=EXT_PORT)


def test_masquerade_clash_remaps_the_second_pod(lab: LabFactory) -> None:
    """Two pods masqueraded to the node's address send from one port to one destination: the
    first flow keeps its port (``get_unique_tuple``: its own tuple is in range and its reply
    tuple free, ``nf_nat_used_tuple``), the second gets another in 1024-65535
    (``nf_nat_l4proto_unique_tuple``, from a random offset), and answers to each port reach
    their own pod."""
    udp = lab(MASQUERADE, [(NODE2_IP, EXT_PORT)])
    seen_a, seen_b = udp.send(A1), udp.send(B1)
    assert seen_a == (NODE_IP, SPORT), f"the first flow arrived from {seen_a}"
    assert seen_b is not None and seen_b[0] == NODE_IP and _remapped(seen_b[1], SPORT), f"the second from {seen_b}"
    assert [udp.answer(A1, seen_a), udp.answer(B1, seen_b)] == [True, True]


def test_remapped_pod_keeps_its_port_for_another_destination(lab: LabFactory) -> None:
    """After the clash above, each pod sends again from the same port to another external
    address: the remapped pod gets the very port its first flow got, the other pod its own
    (``get_unique_tuple`` step 1: ``find_appropriate_src`` finds the earlier mapping of the same
    source in the ``nf_nat_bysource`` table, and its reply tuple towards the new destination is
    free)."""
    a2 = Flow(ns="pa", sport=SPORT, dst=REMOTE, dport=EXT2_PORT)
    b2 = Flow(ns="pb", sport=SPORT, dst=REMOTE, dport=EXT2_PORT)
    udp = lab(MASQUERADE, [(NODE2_IP, EXT_PORT), (REMOTE, EXT2_PORT)])
    seen = {f: udp.send(f) for f in (A1, B1, b2, a2)}
    remapped = seen[B1]
    assert remapped is not None and _remapped(remapped[1], SPORT), f"no remap to build on: {seen}"
    assert seen[b2] == seen[B1], f"pb's flows arrived from {seen[B1]} and {seen[b2]}"
    assert seen[a2] == seen[A1] == (NODE_IP, SPORT), f"pa's flows arrived from {seen[A1]} and {seen[a2]}"
    answered = {f: udp.answer(f, s) for f, s in seen.items() if s is not None}
    assert list(answered.values()) == [True] * 4, f"answers reached their sockets: {answered}"


def test_random_fully_draws_every_port(lab: LabFactory) -> None:
    """``MASQUERADE --random-fully`` (``NF_NAT_RANGE_PROTO_RANDOM_FULLY``): ``get_unique_tuple``
    skips keeping the port even when it is free, so ``nf_nat_l4proto_unique_tuple`` draws every
    flow's port in 1024-65535: at most one flow of 24 keeps its port (by chance, 1 in 64512
    each), all ports differ and every answer finds its pod."""
    flows = [Flow(ns=ns, sport=41000 + i, dst=NODE2_IP, dport=EXT_PORT) for ns in ("pa", "pb", "pc") for i in range(8)]
    udp = lab(RANDOM_FULLY, [(NODE2_IP, EXT_PORT)])
    seen = {f: udp.send(f) for f in flows}
    answered = [udp.answer(f, s) for f, s in seen.items() if s is not None]
    ports = [s[1] for s in seen.values() if s is not None and s[0] == NODE_IP]
    assert len(ports) == len(flows) and answered == [True] * len(flows), f"{seen}, answered {answered}"
    assert all(1024 <= p <= 65535 for p in ports) and len(set(ports)) == len(ports), ports
    assert sum(p == f.sport for f, p in zip(flows, ports, strict=True)) <= 1, ports


def test_random_fully_keeps_low_ports_low(lab: LabFactory) -> None:
    """``nf_nat_l4proto_unique_tuple`` without ``--to-ports`` draws a port below 512 from 1-511
    and one in 512-1023 from 600-1023 ("loose convention: >> 512 is credential passing"): under
    ``--random-fully``, flows from ports 100-123 and 700-800 of three pods stay in those ranges."""
    low, mid = (100, 111, 123), (700, 800)
    flows = [Flow(ns=ns, sport=p, dst=NODE2_IP, dport=EXT_PORT) for ns in ("pa", "pb", "pc") for p in (*low, *mid)]
    udp = lab(RANDOM_FULLY, [(NODE2_IP, EXT_PORT)])
    seen = {f: udp.send(f) for f in flows}
    answered = [udp.answer(f, s) for f, s in seen.items() if s is not None]
    assert answered == [True] * len(flows), f"{seen}, answered {answered}"
    ports = {f: s[1] for f, s in seen.items() if s is not None}
    wrong = {f: p for f, p in ports.items() if not (1 <= p <= 511 if f.sport < 512 else 600 <= p <= 1023)}
    assert not wrong, f"out of range: {wrong}"
    assert len(set(ports.values())) == len(flows), ports


def test_null_binding_remaps_a_clashing_client_port(lab: LabFactory) -> None:
    """Without any SNAT rule, one client port to two virtual addresses DNAT'ed to one pod port
    would give both flows the reply tuple pod:9090 -> client:45000. Each new flow still gets a
    source mapping at POSTROUTING (``nf_nat_alloc_null_binding``, a range of the flow's own
    address) through ``get_unique_tuple``; the second flow's own tuple is taken
    (``nf_nat_used_tuple_new``: the clashing entry is subject to NAT), so
    ``nf_nat_l4proto_unique_tuple`` draws it a port in 1024-65535, and answers still reach the
    client's socket from the address it sent to."""
    flows = (Flow(ns="client", sport=CLIENT_SPORT, dst=VIP_A, dport=80),
             Flow(ns="client", sport=CLIENT_SPORT, dst=VIP_B, dport=80))  # fmt: skip
    udp = lab(TWO_VIPS, [])
    udp.listen(PA, POD_PORT, via=[(f.dst, f.dport) for f in flows])
    first, second = (udp.send(f) for f in flows)
    assert first == (EXTERNAL, CLIENT_SPORT), f"the first flow arrived from {first}"
    assert second is not None and second[0] == EXTERNAL and _remapped(second[1], CLIENT_SPORT), f"the second from {second}"
    assert [udp.answer(flows[0], first), udp.answer(flows[1], second)] == [True, True]


def test_one_port_snat_clash_is_dropped(lab: LabFactory) -> None:
    """``SNAT --to-source ADDR:PORT`` is a range of one port, which ``get_unique_tuple`` keeps
    even when it is taken (``range->min_proto.all == range->max_proto.all``); the second pod's
    flow then has the first's reply tuple, ``__nf_conntrack_confirm`` cannot insert its entry
    (``nf_ct_resolve_clash``, ``nf_ct_resolve_clash_harder``: a reply-direction clash is
    never resolved) and drops the packet, counting ``insert_failed``: the listener sees only
    the first flow."""
    b = Flow(ns="pb", sport=SPORT + 1, dst=NODE2_IP, dport=EXT_PORT)
    udp = lab(ONE_PORT, [(NODE2_IP, EXT_PORT)])
    first, second = udp.send(A1), udp.send(b)
    failed = udp.insert_failed()
    assert first == (NODE_IP, 5000), f"the first flow arrived from {first}"
    assert second is None, f"the second flow arrived from {second}"
    assert failed == 1, f"insert_failed went up by {failed}"
    assert udp.answer(A1, first)
