# ruff: noqa: E501  (iptables rules and expectation messages are kept whole to stay readable)
"""Real kernel: the source port source NAT gives a new flow, packet by packet against the emulator.

The namespaces are those of :func:`tests.kernel.harness.topology` (the emulator's node is its
mirror, :func:`tests.scenarios.node_model`): pods ``pa``, ``pb`` and ``pc`` behind
the node, the "external" side ``n2`` on the node's ``eth1`` (192.168.0.3, and 10.180.1.1 on its
``lo`` as a second external address), and the external client on ``eth0``. A test loads one
``iptables-restore`` text into the node namespace and into an emulated
:class:`~emulation.netfilter.Netns`, then sends UDP flows one after another from UDP sockets it
opens in the namespaces: a listener it opens in the destination namespace reads each datagram
and records the (address, port) it came from, which is what source NAT made of the flow. The
emulator gets the same packets in the same order (``Netns.send``) and must make the same choice;
where the kernel draws a port at random, the property is compared (kept, or remapped into which
range), not the number. Where asked, the listener then answers every flow at the address and
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
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from emulation import ManualClock, Packet
from emulation.netfilter import Netns, Outcome
from tests.conftest import require_kernel
from tests.kernel.harness import Topology, netns_socket, topology
from tests.kernel.netns import sh
from tests.scenarios import EXTERNAL, NODE2_IP, NODE_IP, PA, PB, POD_CLIENT, REMOTE, node_model

pytestmark = pytest.mark.kernel

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


class Lab:
    """UDP sockets in the harness's namespaces, all closed by :attr:`stack`: the listeners
    (by the destinations whose flows reach them) and one socket per flow sent."""

    def __init__(self, topo: Topology, stack: ExitStack) -> None:
        self.topo = topo
        self.stack = stack
        self.listeners: dict[tuple[str, int], socket.socket] = {}
        self.senders: dict[Flow, socket.socket] = {}

    def _open(self, key: str) -> socket.socket:
        s = udp_socket(self.topo.names[key])
        self.stack.callback(s.close)
        return s

    def listen(self, ip: str, port: int, *, via: Sequence[tuple[str, int]] = ()) -> None:
        """Open the listener on ``ip:port`` (in the namespace holding ``ip``); flows sent to
        the destinations ``via`` (DNAT'ed to it) arrive there too."""
        s = self._open(HOLDER[ip])
        s.bind((ip, port))
        for dst in ((ip, port), *via):
            self.listeners[dst] = s

    def send(self, flow: Flow) -> Seen | None:
        """Send the flow's first datagram from a new socket bound to its source and connected
        to its destination (kept open for the answer); the source its listener saw, or None
        when the datagram did not arrive."""
        assert flow not in self.senders, f"{flow} sent twice"
        s = self._open(flow.ns)
        s.bind((flow.src, flow.sport))
        s.connect((flow.dst, flow.dport))
        self.senders[flow] = s
        s.send(flow.tag)
        return _receive(self.listeners[(flow.dst, flow.dport)], flow.tag)

    def answer(self, flow: Flow, seen: Seen) -> bool:
        """The listener answers ``flow`` at ``seen``, the source it saw: whether the answer
        reached the socket that sent the flow, from the address and port it was sent to."""
        reply = b"re: " + flow.tag
        self.listeners[(flow.dst, flow.dport)].sendto(reply, seen)
        return _receive(self.senders[flow], reply) == (flow.dst, flow.dport)


def lab(topo: Topology, stack: ExitStack, rules: str, listeners: Sequence[tuple[str, int]]) -> Lab:
    """Load ``rules`` into the node namespace (no conntrack entry exists yet) and open the
    listeners."""
    proc = subprocess.run(["ip", "netns", "exec", topo.names["node"], "iptables-restore"], input=rules,
                          text=True, capture_output=True, timeout=30)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"iptables-restore failed ({proc.returncode}): {proc.stderr.strip()}\n{rules}")
    assert "0 flow entries" in _conntrack(topo, "-L")
    udp = Lab(topo, stack)
    for ip, port in listeners:
        udp.listen(ip, port)
    return udp


def _conntrack(topo: Topology, *args: str) -> str:
    proc = sh("ip", "netns", "exec", topo.names["node"], "conntrack", *args)
    return proc.stdout + proc.stderr


def insert_failed(topo: Topology) -> int:
    """The node's conntrack ``insert_failed`` statistic, summed over CPUs (``conntrack -S``)."""
    fields = _conntrack(topo, "-S").split()
    return sum(int(f.partition("=")[2]) for f in fields if f.startswith("insert_failed="))


@pytest.fixture
def topo() -> Iterator[Topology]:
    require_kernel("iptables-restore", "conntrack", "sysctl")
    with topology() as t:
        yield t


# -- the emulator -------------------------------------------------------------------------------


def emulator(rules: str) -> Netns:
    """The emulated node, holding the same ``iptables-restore`` text."""
    emu = Netns(node_model(), ManualClock())
    emu.restore(rules)
    return emu


def emulate(emu: Netns, flow: Flow, rng: random.Random) -> Outcome:
    """The flow's first datagram through the emulated node, as it arrives from its namespace."""
    src, iif = SOURCE[flow.ns]
    return emu.send(Packet(src=src, dst=flow.dst, sport=flow.sport, dport=flow.dport, protocol="udp",
                           in_interface=iif), rng)  # fmt: skip


def emulated_answer(
    emu: Netns, flow: Flow, out: Outcome, rng: random.Random
) -> tuple[str, int, str, int, str | None]:
    """The listener's answer to ``out.packet`` (sent back where the packet went out) as the
    emulated node forwards it: ``(src, sport, dst, dport, out interface)``."""
    p = out.packet
    back = emu.send(Packet(src=p.dst, dst=p.src, sport=p.dport, dport=p.sport, protocol="udp",
                           in_interface=out.out_interface), rng)  # fmt: skip
    q = back.packet
    return q.src, q.sport, q.dst, q.dport, back.out_interface


def _sent(flow: Flow) -> tuple[str, int, str, int, str | None]:
    """What an answer to ``flow`` must look like when it reaches the flow's namespace."""
    return flow.dst, flow.dport, flow.src, flow.sport, SOURCE[flow.ns][1]


def _remapped(port: int, original: int) -> bool:
    return port != original and 1024 <= port <= 65535


# -- the cases ----------------------------------------------------------------------------------

A1 = Flow(ns="pa", sport=SPORT, dst=NODE2_IP, dport=EXT_PORT)
B1 = Flow(ns="pb", sport=SPORT, dst=NODE2_IP, dport=EXT_PORT)


def test_masquerade_clash_remaps_the_second_pod(topo: Topology) -> None:
    """Two pods masqueraded to the node's address send from one port to one destination: the
    kernel keeps the first flow's port (``get_unique_tuple``: its own tuple is in range and its
    reply tuple free, ``nf_nat_used_tuple``) and gives the second another in 1024-65535
    (``nf_nat_l4proto_unique_tuple``, from a random offset), and answers to each port reach
    their own pod; the emulator chooses alike and translates the answers back alike."""
    with ExitStack() as stack:
        udp = lab(topo, stack, MASQUERADE, [(NODE2_IP, EXT_PORT)])
        seen_a, seen_b = udp.send(A1), udp.send(B1)
        answered = [udp.answer(f, s) for f, s in ((A1, seen_a), (B1, seen_b)) if s is not None]
    assert seen_a == (NODE_IP, SPORT), f"kernel: the first flow arrived from {seen_a}"
    assert seen_b is not None and seen_b[0] == NODE_IP and _remapped(seen_b[1], SPORT), (
        f"kernel: the second from {seen_b}"
    )
    assert answered == [True, True], f"kernel: answers reached their pods: {answered}"

    emu, rng = emulator(MASQUERADE), random.Random(1)
    out_a, out_b = emulate(emu, A1, rng), emulate(emu, B1, rng)
    assert (out_a.verdict, out_a.packet.src, out_a.packet.sport) == ("ACCEPT", NODE_IP, SPORT), out_a
    assert (out_b.verdict, out_b.packet.src) == ("ACCEPT", NODE_IP) and _remapped(
        out_b.packet.sport, SPORT
    ), out_b
    for flow, out in ((A1, out_a), (B1, out_b)):
        assert emulated_answer(emu, flow, out, rng) == _sent(flow)


def test_remapped_pod_keeps_its_port_for_another_destination(topo: Topology) -> None:
    """After the clash above, each pod sends again from the same port to another external
    address: the kernel gives the remapped pod the very port it gave its first flow, and the
    other pod its own (``get_unique_tuple`` step 1: ``find_appropriate_src`` finds the earlier
    mapping of the same source in the ``nf_nat_bysource`` table, and its reply tuple towards
    the new destination is free); the emulator reports, for each pod, the number it reported
    for that pod's first flow."""
    a2 = Flow(ns="pa", sport=SPORT, dst=REMOTE, dport=EXT2_PORT)
    b2 = Flow(ns="pb", sport=SPORT, dst=REMOTE, dport=EXT2_PORT)
    with ExitStack() as stack:
        udp = lab(topo, stack, MASQUERADE, [(NODE2_IP, EXT_PORT), (REMOTE, EXT2_PORT)])
        kernel = {f: udp.send(f) for f in (A1, B1, b2, a2)}
        answered = {f: udp.answer(f, s) for f, s in kernel.items() if s is not None}
    remapped = kernel[B1]
    assert remapped is not None and _remapped(remapped[1], SPORT), f"kernel: no remap to build on: {kernel}"
    assert kernel[b2] == kernel[B1], f"kernel: pb's flows arrived from {kernel[B1]} and {kernel[b2]}"
    assert kernel[a2] == kernel[A1] == (NODE_IP, SPORT), (
        f"kernel: pa's flows arrived from {kernel[A1]} and {kernel[a2]}"
    )
    assert list(answered.values()) == [True] * 4, f"kernel: answers reached their sockets: {answered}"

    emu, rng = emulator(MASQUERADE), random.Random(2)
    out = {f: emulate(emu, f, rng) for f in (A1, B1, b2, a2)}
    assert {o.verdict for o in out.values()} == {"ACCEPT"}, out
    assert _remapped(out[B1].packet.sport, SPORT), out[B1]
    assert out[b2].packet.sport == out[B1].packet.sport, (
        f"emulator: pb's flows got {out[B1].packet.sport} and {out[b2].packet.sport}"
    )
    assert out[a2].packet.sport == out[A1].packet.sport == SPORT, out[a2]
    for flow, o in out.items():
        assert emulated_answer(emu, flow, o, rng) == _sent(flow)


def test_random_fully_draws_every_port(topo: Topology) -> None:
    """``MASQUERADE --random-fully`` (``NF_NAT_RANGE_PROTO_RANDOM_FULLY``): ``get_unique_tuple``
    skips keeping the port even when it is free, so ``nf_nat_l4proto_unique_tuple`` draws every
    flow's port in 1024-65535; in the kernel and the emulator alike, at most one flow of 24 keeps
    its port (by chance, 1 in 64512 each), all ports differ and every answer finds its pod."""
    flows = [
        Flow(ns=ns, sport=41000 + i, dst=NODE2_IP, dport=EXT_PORT)
        for ns in ("pa", "pb", "pc")
        for i in range(8)
    ]
    with ExitStack() as stack:
        udp = lab(topo, stack, RANDOM_FULLY, [(NODE2_IP, EXT_PORT)])
        kernel = {f: udp.send(f) for f in flows}
        answered = [udp.answer(f, s) for f, s in kernel.items() if s is not None]
    ports = [s[1] for s in kernel.values() if s is not None and s[0] == NODE_IP]
    assert len(ports) == len(flows) and answered == [True] * len(flows), (
        f"kernel: {kernel}, answered {answered}"
    )
    assert all(1024 <= p <= 65535 for p in ports) and len(set(ports)) == len(ports), f"kernel: {ports}"
    assert sum(p == f.sport for f, p in zip(flows, ports, strict=True)) <= 1, f"kernel: {ports}"

    emu, rng = emulator(RANDOM_FULLY), random.Random(3)
    out = [emulate(emu, f, rng) for f in flows]
    got = [o.packet.sport for o in out]
    assert {(o.verdict, o.packet.src) for o in out} == {("ACCEPT", NODE_IP)}, out
    assert all(1024 <= p <= 65535 for p in got) and len(set(got)) == len(got), f"emulator: {got}"
    assert sum(p == f.sport for f, p in zip(flows, got, strict=True)) <= 1, f"emulator: {got}"
    for flow, o in zip(flows, out, strict=True):
        assert emulated_answer(emu, flow, o, rng) == _sent(flow)


def test_random_fully_keeps_low_ports_low(topo: Topology) -> None:
    """``nf_nat_l4proto_unique_tuple`` without ``--to-ports`` draws a port below 512 from 1-511
    and one in 512-1023 from 600-1023 ("loose convention: >> 512 is credential passing"): under
    ``--random-fully``, flows from ports 100-123 and 700-800 of three pods stay in those
    ranges, in the kernel and in the emulator."""
    low, mid = (100, 111, 123), (700, 800)
    flows = [
        Flow(ns=ns, sport=p, dst=NODE2_IP, dport=EXT_PORT) for ns in ("pa", "pb", "pc") for p in (*low, *mid)
    ]
    with ExitStack() as stack:
        udp = lab(topo, stack, RANDOM_FULLY, [(NODE2_IP, EXT_PORT)])
        kernel = {f: udp.send(f) for f in flows}
        answered = [udp.answer(f, s) for f, s in kernel.items() if s is not None]
    assert answered == [True] * len(flows), f"kernel: {kernel}, answered {answered}"

    def wrong(got: dict[Flow, int]) -> dict[Flow, int]:
        return {f: p for f, p in got.items() if not (1 <= p <= 511 if f.sport < 512 else 600 <= p <= 1023)}

    kernel_ports = {f: s[1] for f, s in kernel.items() if s is not None}
    assert not wrong(kernel_ports), f"kernel: out of range: {wrong(kernel_ports)}"
    assert len(set(kernel_ports.values())) == len(flows), f"kernel: {kernel_ports}"

    emu, rng = emulator(RANDOM_FULLY), random.Random(4)
    out = {f: emulate(emu, f, rng) for f in flows}
    emulated = {f: o.packet.sport for f, o in out.items()}
    assert {(o.verdict, o.packet.src) for o in out.values()} == {("ACCEPT", NODE_IP)}, out
    assert not wrong(emulated), f"emulator: out of range: {wrong(emulated)}"
    assert len(set(emulated.values())) == len(flows), f"emulator: {emulated}"


def test_null_binding_remaps_a_clashing_client_port(topo: Topology) -> None:
    """Without any SNAT rule, one client port to two virtual addresses DNAT'ed to one pod port
    would give both flows the reply tuple pod:9090 -> client:45000. The kernel still gives
    each new flow a source mapping at POSTROUTING (``nf_nat_alloc_null_binding``, a range of
    the flow's own address) through ``get_unique_tuple``; the second flow's own tuple is taken
    (``nf_nat_used_tuple_new``: the clashing entry is subject to NAT), so
    ``nf_nat_l4proto_unique_tuple`` draws it a port in 1024-65535, and answers still reach the
    client's socket from the address it sent to. The emulator: ``snat`` True, another port in
    1024-65535, and the same answers."""
    flows = (Flow(ns="client", sport=CLIENT_SPORT, dst=VIP_A, dport=80),
             Flow(ns="client", sport=CLIENT_SPORT, dst=VIP_B, dport=80))  # fmt: skip
    with ExitStack() as stack:
        udp = lab(topo, stack, TWO_VIPS, [])
        udp.listen(PA, POD_PORT, via=[(f.dst, f.dport) for f in flows])
        first, second = (udp.send(f) for f in flows)
        answered = [udp.answer(f, s) for f, s in zip(flows, (first, second), strict=True) if s is not None]
    assert first == (EXTERNAL, CLIENT_SPORT), f"kernel: the first flow arrived from {first}"
    assert second is not None and second[0] == EXTERNAL and _remapped(second[1], CLIENT_SPORT), (
        f"kernel: the second from {second}"
    )
    assert answered == [True, True], f"kernel: answers reached the client: {answered}"

    emu, rng = emulator(TWO_VIPS), random.Random(5)
    out1, out2 = (emulate(emu, f, rng) for f in flows)
    assert (out1.verdict, out1.snat, out1.destination, out1.packet.sport) == (
        "ACCEPT",
        False,
        f"{PA}:{POD_PORT}",
        CLIENT_SPORT,
    ), out1
    assert (out2.verdict, out2.snat, out2.destination, out2.packet.src) == (
        "ACCEPT",
        True,
        f"{PA}:{POD_PORT}",
        EXTERNAL,
    ), out2
    assert _remapped(out2.packet.sport, CLIENT_SPORT), out2
    for flow, out in zip(flows, (out1, out2), strict=True):
        assert emulated_answer(emu, flow, out, rng) == _sent(flow)


def test_one_port_snat_clash_is_dropped(topo: Topology) -> None:
    """``SNAT --to-source ADDR:PORT`` is a range of one port, which ``get_unique_tuple`` keeps
    even when it is taken (``range->min_proto.all == range->max_proto.all``); the second pod's
    flow then has the first's reply tuple, ``__nf_conntrack_confirm`` cannot insert its entry
    (``nf_ct_resolve_clash``, ``nf_ct_resolve_clash_harder``: a reply-direction clash is
    never resolved) and drops the packet, counting ``insert_failed``: the listener sees only
    the first flow. The emulator: the first ACCEPTed from port 5000, the second DROPped."""
    b = Flow(ns="pb", sport=SPORT + 1, dst=NODE2_IP, dport=EXT_PORT)
    with ExitStack() as stack:
        udp = lab(topo, stack, ONE_PORT, [(NODE2_IP, EXT_PORT)])
        failed_before = insert_failed(topo)
        first, second = udp.send(A1), udp.send(b)
        failed = insert_failed(topo) - failed_before
        answered = udp.answer(A1, first) if first is not None else None
    assert first == (NODE_IP, 5000), f"kernel: the first flow arrived from {first}"
    assert second is None, f"kernel: the second flow arrived from {second}"
    assert failed == 1 and answered, (
        f"kernel: insert_failed went up by {failed}; answer reached pa: {answered}"
    )

    emu, rng = emulator(ONE_PORT), random.Random(6)
    out_a, out_b = emulate(emu, A1, rng), emulate(emu, b, rng)
    assert (out_a.verdict, out_a.packet.src, out_a.packet.sport) == ("ACCEPT", NODE_IP, 5000), out_a
    assert out_b.verdict == "DROP", out_b
    assert len(emu.conntrack.entries()) == 1
