"""SCTP Services against the real kernel, with SCTP packets written by hand on raw sockets.

The test kernel has no SCTP stack (``CONFIG_IP_SCTP`` is off: ``socket(AF_INET, SOCK_STREAM,
IPPROTO_SCTP)`` fails with EPROTONOSUPPORT), but conntrack tracks SCTP
(``CONFIG_NF_CT_PROTO_SCTP``), NAT rewrites it, ``-m sctp`` matches it
(``CONFIG_NETFILTER_XT_MATCH_SCTP``) and raw sockets of protocol 132 work. So the test writes
the first packet of an association itself -- the 12-byte common header (RFC 4960 section 3.1)
and a single INIT chunk (section 3.3.2) -- sends it from a namespace of the harness
(:func:`tests.kernel.harness.topology`) with a raw socket (the kernel adds the IPv4 header),
and catches it with raw SCTP sockets in the endpoint namespaces (``pa``, ``pb`` and the other
node): which pod got it, the destination port it arrived on (the endpoint's port after DNAT)
and its source address (masquerade). Every attempt has its own source port and initiate tag,
so whatever is caught is traced back to its attempt. A raw socket of the protocol also keeps
the receiving namespace from answering with an ICMP protocol unreachable (no SCTP handler:
``ip_protocol_deliver_rcu`` sends one only when no raw socket took the packet).

Valid packets. Conntrack validates SCTP (net/netfilter/nf_conntrack_proto_sctp.c):
``sctp_error`` compares the CRC32c of a packet arriving from a device (PREROUTING, checksum
not verified yet, ``nf_conntrack_checksum=1``) with ``sctp_compute_cksum``; ``do_basic_checks``
wants an INIT to be the only chunk and no chunk of length 0; ``sctp_new`` wants the
verification tag of an INIT to be 0 and its INIT header present. A packet failing these is
INVALID: conntrack attaches no entry, NAT never sees it, and kube-proxy's ``KUBE-FORWARD -m
conntrack --ctstate INVALID -j DROP`` drops it. The CRC32c (Castagnoli, RFC 4960 appendix B)
is computed here byte by byte from a table, over the whole SCTP packet with the checksum
field zero, and stored least significant byte first, the byte order of the kernel's
``cpu_to_le32(~crc)``. :func:`test_kernel_drops_a_bad_checksum` shows the kernel checks it.

What kube-proxy writes for SCTP: the rules of TCP and UDP with ``-m sctp -p sctp --dport N``
(DNAT in ``KUBE-SEP-*``, KUBE-MARK-MASQ and MASQUERADE, the LoadBalancer firewall chain) and,
for a Service without endpoints, ``-j REJECT`` in filter ``KUBE-SERVICES`` (ClusterIP) and
``KUBE-EXTERNAL-SERVICES`` (NodePort, external IP, LoadBalancer IP). REJECT's default
``icmp-port-unreachable`` goes out for SCTP too: ``nf_send_unreach`` skips its checksum test
for protocols without an Internet checksum (``nf_reject_verify_csum``) and calls
``icmp_send``; the sending namespace reads the error with a raw ICMP socket. When the node
itself sends, the netfilter drop also fails ``sendto`` with EPERM (``ip_local_out`` returns it
and ``raw_sendmsg`` passes it on). NAT rewrites the ports and recomputes the CRC32c
(``sctp_manip_pkt``, the checksum not being offloaded), so every packet a pod receives must
carry a valid checksum; that is checked too.

Compared with the emulator, for each case under each configuration of the masquerade matrix
(``detect``, ``nodetect``, ``masqall`` of ``tests/scenarios.py``, on the same
node): the emulator enumerates the same packet (protocol ``sctp``) and must give the kernel's
verdict (ACCEPT: a pod got it; REJECT: an ICMP port unreachable came back and no pod got it;
DROP: neither), the same endpoints (each endpoint of positive probability was reached within
the attempts, and no other) and, per endpoint, the source address the pod saw.
:func:`test_cases_say_what_kube_proxy_does` holds the emulator to kube-proxy's intent (no
kernel needed), so agreement with the kernel is agreement on kube-proxy's behaviour.

Conntrack. An INIT that gets no answer leaves its entry CLOSED for 10 s (``sctp_conntracks``:
INIT in the original direction takes ``sNO`` to ``sCL``; ``sctp_timeouts[SCTP_CONNTRACK_CLOSED]``
is 10 s); COOKIE_WAIT (3 s) needs the INIT_ACK. A retransmitted INIT does not renew that
timeout ("don't renew timeout on init retransmit" in ``nf_conntrack_sctp_packet``).
:func:`test_unreplied_init_conntrack_timeout` compares both with the emulator's conntrack.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import select
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from emulation import ManualClock
from emulation.netfilter import Netns
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer, RenderResult
from kproxy.modes.iptables.mode import program
from tests.conftest import require_kernel
from tests.kernel.harness import Topology, netns_socket, topology
from tests.kernel.netns import sh
from tests.scenarios import (
    ALL,
    CLIENT_GW,
    CONFIGS,
    HALF,
    NODE,
    NODE_IP,
    NONE,
    OTHER,
    OUTSIDE,
    PA,
    PB,
    POD,
    POD_GW,
    REMOTE,
    SOURCES,
    Case,
    case_packet,
    load_emulator,
)
from tests.unit.modes.kube import endpoint_slice, ep, port, service, snapshot_of

pytestmark = pytest.mark.kernel

IPPROTO_SCTP = 132
#: SCTP chunk type of INIT (RFC 4960 section 3.2).
INIT = 1
#: The receiver window, stream counts and length the INIT chunk announces (any valid values).
A_RWND, STREAMS, INIT_CHUNK_LEN = 65535, 10, 20

# -- CRC32c -------------------------------------------------------------------------------------

#: The CRC32c polynomial 0x1EDC6F41, bit-reversed (the CRC is computed least significant bit first).
CASTAGNOLI = 0x82F63B78


def _crc32c_table() -> tuple[int, ...]:
    """The CRC of every byte value, for a byte-at-a-time CRC32c."""
    table = []
    for value in range(256):
        crc = value
        for _ in range(8):
            crc = (crc >> 1) ^ (CASTAGNOLI if crc & 1 else 0)
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC32c of ``data`` (initial value and final xor all ones, as RFC 4960 appendix B)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def sctp_checksum_field(packet: bytes) -> bytes:
    """The 4 checksum bytes for an SCTP ``packet``: the CRC32c of the packet with its checksum
    field zeroed, least significant byte first (the kernel's ``cpu_to_le32(~crc)``)."""
    return struct.pack("<I", crc32c(packet[:8] + bytes(4) + packet[12:]))


def sctp_init(sport: int, dport: int, tag: int, *, corrupt: bool = False) -> bytes:
    """An SCTP packet holding one INIT chunk, as a client's first packet of an association.

    The verification tag is 0 (RFC 4960 section 8.5.1 (A); ``sctp_new`` insists), the initiate
    tag ``tag`` (nonzero, section 3.3.2; it identifies the attempt), the initial TSN ``tag`` too.
    ``corrupt`` flips one bit of the checksum.
    """
    assert 0 < tag < 2**32
    chunk = struct.pack("!BBHIIHHI", INIT, 0, INIT_CHUNK_LEN, tag, A_RWND, STREAMS, STREAMS, tag)
    packet = struct.pack("!HHI", sport, dport, 0) + bytes(4) + chunk
    checksum = sctp_checksum_field(packet)
    if corrupt:
        checksum = bytes([checksum[0] ^ 1]) + checksum[1:]
    return packet[:8] + checksum + packet[12:]


@dataclass(frozen=True, slots=True)
class Arrival:
    """An INIT caught in an endpoint namespace.

    Attributes:
        ns: the harness key of the namespace that received it.
        src, dst, dport: its source address, destination address and port as received.
        tag: its initiate tag (names the attempt).
        checksum_ok: its CRC32c is right (NAT recomputed it after rewriting the ports).
    """

    ns: str
    src: str
    dst: str
    dport: int
    tag: int
    checksum_ok: bool


def parse_init(ns: str, datagram: bytes) -> Arrival | None:
    """The INIT in an IPv4 datagram read from a raw socket (which includes the IP header);
    None for anything else."""
    ihl = (datagram[0] & 0x0F) * 4
    sctp = datagram[ihl:]
    if datagram[9] != IPPROTO_SCTP or len(sctp) < 12 + INIT_CHUNK_LEN or sctp[12] != INIT:
        return None
    _, dport = struct.unpack("!HH", sctp[:4])
    (tag,) = struct.unpack("!I", sctp[16:20])
    return Arrival(ns=ns, src=socket.inet_ntoa(datagram[12:16]), dst=socket.inet_ntoa(datagram[16:20]),
                   dport=dport, tag=tag, checksum_ok=sctp[8:12] == sctp_checksum_field(sctp))  # fmt: skip


def parse_icmp_error(datagram: bytes) -> tuple[int, int, int] | None:
    """``(type, code, source port)`` of an ICMP error about an SCTP packet, from an IPv4
    datagram read from a raw ICMP socket; None for any other ICMP message."""
    ihl = (datagram[0] & 0x0F) * 4
    icmp_type, code = datagram[ihl], datagram[ihl + 1]
    inner = datagram[ihl + 8 :]
    if icmp_type not in (3, 11, 12) or len(inner) < 20:
        return None
    inner_ihl = (inner[0] & 0x0F) * 4
    if inner[9] != IPPROTO_SCTP or len(inner) < inner_ihl + 2:
        return None
    (sport,) = struct.unpack("!H", inner[inner_ihl : inner_ihl + 2])
    return icmp_type, code, sport


# -- the cluster and the cases ------------------------------------------------------------------

S1, S2, S3, S4, S5 = (f"172.30.0.6{i}" for i in range(1, 6))
EXT2, EXT4 = "192.168.99.62", "192.168.99.64"
LB2, LB4 = "5.6.7.62", "5.6.7.64"
A1, B1 = f"{PA}:9001", f"{PB}:9001"
B2, R2 = f"{PB}:9002", f"{REMOTE}:9002"
A3, R3 = f"{PA}:9003", f"{REMOTE}:9003"
A5 = f"{PA}:9005"


def sctp_cluster() -> list[dict[str, Any]]:
    """SCTP Services and EndpointSlices (API dicts), each endpoint on its own port."""
    lb = "LoadBalancer"
    return [
        # ClusterIP, two endpoints on this node.
        service("sctp", "s1", S1, [port("p", 80, "SCTP", targetPort=9001)]),
        endpoint_slice("sctp", "s1", [ep(PA, NODE), ep(PB, NODE)], [("p", 9001, "SCTP")]),
        # LoadBalancer (NodePort, external IP, LoadBalancer IP with source ranges), a local and
        # a remote endpoint.
        service("sctp", "s2", S2, [port("p", 80, "SCTP", targetPort=9002, nodePort=30062)], type=lb,
                externalIPs=[EXT2], loadBalancerSourceRanges=["203.0.113.0/25"], ingress=[LB2]),
        endpoint_slice("sctp", "s2", [ep(PB, NODE), ep(REMOTE, OTHER)], [("p", 9002, "SCTP")]),
        # NodePort, externalTrafficPolicy: Local, a local and a remote endpoint.
        service("sctp", "s3", S3, [port("p", 80, "SCTP", targetPort=9003, nodePort=30063)], type="NodePort",
                externalTrafficPolicy="Local"),
        endpoint_slice("sctp", "s3", [ep(PA, NODE), ep(REMOTE, OTHER)], [("p", 9003, "SCTP")]),
        # No endpoints: REJECT on every address.
        service("sctp", "s4", S4, [port("p", 80, "SCTP", targetPort=9004, nodePort=30064)], type=lb,
                externalIPs=[EXT4], ingress=[LB4]),
        # ClusterIP whose only endpoint is pa (hairpin).
        service("sctp", "s5", S5, [port("p", 80, "SCTP", targetPort=9005)]),
        endpoint_slice("sctp", "s5", [ep(PA, NODE)], [("p", 9005, "SCTP")]),
    ]  # fmt: skip


def _case(name: str, source: str, dst: str, dport: int, **kw: Any) -> Case:
    return Case(name=name, source=source, dst=dst, dport=dport, proto="sctp", **kw)


# What kube-proxy does with each packet (masquerade under detect, nodetect, masqall).
# fmt: off
CASES: tuple[Case, ...] = (
    _case("clusterip-from-pod", "pod", S1, 80, endpoints={A1: HALF, B1: HALF}, masq=POD),
    _case("clusterip-from-node", "node", S1, 80, endpoints={A1: HALF, B1: HALF}, masq=OUTSIDE),
    _case("clusterip-from-external", "external", S1, 80, endpoints={A1: HALF, B1: HALF}, masq=OUTSIDE),
    _case("clusterip-hairpin", "hairpin", S5, 80, endpoints={A5: 1.0}, masq=ALL),
    _case("nodeport-from-external", "external", NODE_IP, 30062, endpoints={B2: HALF, R2: HALF}, masq=ALL),
    _case("nodeport-on-another-local-address", "external", CLIENT_GW, 30062, endpoints={B2: HALF, R2: HALF},
          masq=ALL),
    _case("nodeport-from-pod", "pod", NODE_IP, 30062, endpoints={B2: HALF, R2: HALF}, masq=ALL),
    _case("nodeport-from-node", "node", NODE_IP, 30062, endpoints={B2: HALF, R2: HALF}, masq=ALL),
    _case("nodeport-from-localhost", "localhost", "127.0.0.1", 30062, endpoints={B2: HALF, R2: HALF},
          masq=ALL),
    _case("externalip-from-external", "external", EXT2, 80, endpoints={B2: HALF, R2: HALF}, masq=ALL),
    _case("lb-from-allowed-external", "external", LB2, 80, endpoints={B2: HALF, R2: HALF}, masq=ALL),
    _case("lb-from-blocked-external", "blocked", LB2, 80, verdict="DROP"),
    _case("lb-nodeport-ignores-source-ranges", "blocked", NODE_IP, 30062, endpoints={B2: HALF, R2: HALF},
          masq=ALL),
    _case("etp-local-nodeport-external", "external", NODE_IP, 30063, endpoints={A3: 1.0}, masq=NONE),
    _case("etp-local-nodeport-from-pod", "pod", NODE_IP, 30063, endpoints={A3: HALF, R3: HALF}, masq=NONE,
          overrides={"nodetect": {A3: 1.0}}),
    _case("no-endpoints-clusterip", "pod", S4, 80, verdict="REJECT"),
    _case("no-endpoints-clusterip-from-node", "node", S4, 80, verdict="REJECT"),
    _case("no-endpoints-nodeport", "external", NODE_IP, 30064, verdict="REJECT"),
    _case("no-endpoints-externalip", "external", EXT4, 80, verdict="REJECT"),
    _case("no-endpoints-lb", "external", LB4, 80, verdict="REJECT"),
)
# fmt: on
BY_NAME = {c.name: c for c in CASES}


def masquerade_source(endpoint: str) -> str:
    """The address MASQUERADE gives a packet for ``endpoint``: that of the interface it leaves
    by (a pod veth's 169.254.1.1, or eth1's node IP towards the other node)."""
    return NODE_IP if endpoint.startswith(f"{REMOTE}:") else POD_GW


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """The emulator's view of a packet: its verdicts (one, if the rules are deterministic
    there), ``{endpoint: probability}`` of its accepted outcomes, the source address each
    endpoint sees, and whether an unknown match or target was met."""

    verdicts: frozenset[str]
    endpoints: dict[str, float]
    peers: dict[str, set[str]]
    uncertain: bool


def predict(netns: Netns, case: Case, sport: int = 40000) -> Prediction:
    """Enumerate ``case``'s packet (source port ``sport``) in the emulated node."""
    endpoints: dict[str, float] = {}
    peers: dict[str, set[str]] = {}
    outcomes = netns.enumerate(case_packet(case, sport))
    for p, o in outcomes:
        if o.verdict == "ACCEPT":
            endpoints[o.destination] = endpoints.get(o.destination, 0.0) + p
            peers.setdefault(o.destination, set()).add(o.packet.src)
    return Prediction(verdicts=frozenset(o.verdict for _, o in outcomes), endpoints=endpoints, peers=peers,
                      uncertain=any(o.uncertain for _, o in outcomes))  # fmt: skip


def _render(config: IptablesConfig) -> RenderResult:
    return IptablesRenderer(config).render(snapshot_of(sctp_cluster(), hostname=NODE), full=True)


# -- raw sockets in the harness namespaces ------------------------------------------------------

#: The namespaces holding endpoints, and their address.
RECEIVERS = {"pa": PA, "pb": PB, "n2": REMOTE}
#: The namespaces that send, where ICMP errors are read.
SENDERS = ("pc", "pa", "node", "client")
#: How long to wait for packets and ICMP errors after the last attempt was sent.
SETTLE_S = 0.75
#: Source ports of attempts count up from here (every attempt is a new conntrack flow).
FIRST_SPORT = 20000
#: Attempts for a case with several endpoints: one is missed with probability 2 * 0.5 ** 20.
ATTEMPTS = 20


@dataclass(frozen=True, slots=True, eq=False)
class Attempt:
    """One INIT to send: from the case's source, with its own source port and initiate tag
    (compared and hashed by identity: each is one send)."""

    case: Case
    sport: int
    tag: int
    corrupt: bool = False


@dataclass(slots=True)
class Fate:
    """What the kernel did with one attempt: the copies pods received, the ICMP errors about
    it (``(type, code)``) that came back to its sender, and whether ``sendto`` failed with EPERM."""

    arrivals: list[Arrival] = field(default_factory=list)
    icmp: list[tuple[int, int]] = field(default_factory=list)
    eperm: bool = False

    @property
    def kind(self) -> str:
        """ACCEPT (a pod got it), REJECT (ICMP port unreachable, nothing reached a pod), DROP
        (neither); anything else is described."""
        if self.arrivals and self.icmp:
            return f"MIXED {self.icmp}"
        if self.arrivals:
            return "ACCEPT"
        if self.icmp:
            return "REJECT" if set(self.icmp) == {(3, 3)} else f"ICMP {self.icmp}"
        return "DROP"


class Wire:
    """Raw sockets in the harness's namespaces: SCTP receivers in the endpoint namespaces,
    ICMP readers and SCTP senders (one per source address) in the sending ones."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._sockets: list[socket.socket] = []
        self._rx = {key: self._open(key, IPPROTO_SCTP) for key in RECEIVERS}
        for s in self._rx.values():
            s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 1 << 20)
        self._icmp = {key: self._open(key, socket.IPPROTO_ICMP) for key in SENDERS}
        self._tx: dict[tuple[str, str], socket.socket] = {}
        self._ports = itertools.count(FIRST_SPORT)
        self._tags = itertools.count(1)

    def _open(self, key: str, proto: int) -> socket.socket:
        s = netns_socket(self.topo.names[key], socket.SOCK_RAW, proto)
        self._sockets.append(s)
        return s

    def close(self) -> None:
        """Close every socket."""
        for s in self._sockets:
            s.close()

    def attempts(self, case: Case, count: int, *, corrupt: bool = False) -> list[Attempt]:
        """``count`` new attempts of ``case``."""
        return [Attempt(case, next(self._ports), next(self._tags), corrupt) for _ in range(count)]

    def run(self, attempts: list[Attempt], settle_s: float = SETTLE_S) -> dict[Attempt, Fate]:
        """Send every attempt, then collect what arrives for ``settle_s``; the fate of each."""
        for s in self._sockets:
            _drain(s)
        fates = {a: Fate() for a in attempts}
        by_tag = {a.tag: fates[a] for a in attempts}
        by_sport = {a.sport: fates[a] for a in attempts}
        for a in attempts:
            ns, src = SOURCES[a.case.source]
            try:
                self._sender(ns, src).sendto(sctp_init(a.sport, a.case.dport, a.tag, corrupt=a.corrupt),
                                             (a.case.dst, 0))  # fmt: skip
            except PermissionError:
                fates[a].eperm = True
        readers = {s: key for key, s in self._rx.items()} | {s: "" for s in self._icmp.values()}
        deadline = time.monotonic() + settle_s
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(readers), [], [], left)
            for s in ready:
                for datagram in _drain(s):
                    if readers[s]:
                        arrival = parse_init(readers[s], datagram)
                        if arrival is not None and arrival.tag in by_tag:
                            by_tag[arrival.tag].arrivals.append(arrival)
                    elif (err := parse_icmp_error(datagram)) is not None and err[2] in by_sport:
                        by_sport[err[2]].icmp.append((err[0], err[1]))
        return fates

    def _sender(self, ns: str, src: str) -> socket.socket:
        s = self._tx.get((ns, src))
        if s is None:
            s = self._tx[(ns, src)] = self._open(ns, IPPROTO_SCTP)
            s.bind((src, 0))
        return s


def _drain(s: socket.socket) -> list[bytes]:
    """Every datagram waiting on ``s``, without blocking."""
    out = []
    while True:
        try:
            out.append(s.recv(65535, socket.MSG_DONTWAIT))
        except BlockingIOError:
            return out


@pytest.fixture(scope="module")
def wire() -> Iterator[Wire]:
    require_kernel("iptables-restore", "iptables-save", "iptables", "sysctl")
    with topology() as topo:
        w = Wire(topo)
        try:
            yield w
        finally:
            w.close()


# -- tests without the kernel -------------------------------------------------------------------


def test_crc32c_known_answers() -> None:
    """CRC32c's check value, and the iSCSI test vectors of RFC 3720 appendix B.4."""
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E


def test_init_packet_layout() -> None:
    """The INIT: common header (ports, verification tag 0, checksum little-endian) and one
    20-byte INIT chunk; parsing it back gives its ports, tag and a valid checksum."""
    packet = sctp_init(40000, 80, 0x1234)
    assert len(packet) == 32
    assert struct.unpack("!HHI", packet[:8]) == (40000, 80, 0)
    assert struct.unpack("<I", packet[8:12])[0] == crc32c(packet[:8] + bytes(4) + packet[12:])
    assert struct.unpack("!BBHIIHHI", packet[12:]) == (1, 0, 20, 0x1234, A_RWND, STREAMS, STREAMS, 0x1234)
    ip = bytes([0x45]) + bytes(8) + bytes([IPPROTO_SCTP]) + bytes(2) + socket.inet_aton("10.0.0.2") * 2
    arrival = parse_init("pa", ip + packet)
    assert arrival == Arrival(ns="pa", src="10.0.0.2", dst="10.0.0.2", dport=80, tag=0x1234, checksum_ok=True)
    assert parse_init("pa", ip + sctp_init(40000, 80, 0x1234, corrupt=True)) == Arrival(
        ns="pa", src="10.0.0.2", dst="10.0.0.2", dport=80, tag=0x1234, checksum_ok=False
    )


@pytest.mark.parametrize("config", list(CONFIGS))
def test_cases_say_what_kube_proxy_does(config: str) -> None:
    """The emulator gives each case kube-proxy's verdict, endpoints (with their probabilities)
    and the source address each endpoint sees, under each configuration; so the kernel
    agreeing with the emulator below means the kernel does what kube-proxy intends."""
    emulator = load_emulator(CONFIGS[config], sctp_cluster())
    wrong = []
    for case in CASES:
        want = predict(emulator, case)
        endpoints = case.endpoints_for(config)
        src = SOURCES[case.source][1]
        seen = {e: {masquerade_source(e) if case.masq_for(config) else src} for e in endpoints}
        ok = want.verdicts == {case.verdict_for(config)} and not want.uncertain
        ok = ok and want.endpoints.keys() == endpoints.keys() and want.peers == seen
        ok = ok and all(want.endpoints[e] == pytest.approx(p) for e, p in endpoints.items())
        if not ok:
            wrong.append(f"{case.name}: emulator {sorted(want.verdicts)} {want.endpoints} {want.peers}")
    assert not wrong, "\n".join(wrong)


# -- tests against the kernel -------------------------------------------------------------------


def _count(case: Case, want: Prediction) -> int:
    """Attempts: many where endpoints are drawn at random, two for one endpoint, one otherwise."""
    if len(want.endpoints) > 1 or len(case.endpoints) > 1:
        return ATTEMPTS
    return 2 if want.endpoints else 1


def _problem(case: Case, want: Prediction, fates: list[Fate]) -> str | None:
    """Why the kernel's fates of ``case``'s attempts disagree with the emulator; None if they agree."""
    kinds = {f.kind for f in fates}
    arrivals = [a for f in fates for a in f.arrivals]
    eps = {f"{a.dst}:{a.dport}" for a in arrivals}
    peers = {(f"{a.dst}:{a.dport}", a.src) for a in arrivals}
    faults = [f"{a} in the wrong namespace" for a in arrivals if RECEIVERS[a.ns] != a.dst]
    faults += [f"{a} has a bad checksum" for a in arrivals if not a.checksum_ok]
    faults += [f"received {len(f.arrivals)} times" for f in fates if len(f.arrivals) > 1]
    if SOURCES[case.source][0] == "node":
        # A packet of the node's own that netfilter discards fails sendto with EPERM.
        faults += [f"{f.kind} but EPERM={f.eperm}" for f in fates if f.eperm != (f.kind != "ACCEPT")]
    ok = kinds == set(want.verdicts) and len(want.verdicts) == 1 and eps == set(want.endpoints)
    ok = ok and all(peer in want.peers.get(e, set()) for e, peer in peers) and not faults
    if ok:
        return None
    return (f"{case.name}: kernel {sorted(kinds)} {sorted(eps)} peers {sorted(peers)} {faults}; "
            f"emulator {sorted(want.verdicts)} {want.endpoints} peers {want.peers}")  # fmt: skip


@pytest.mark.parametrize("config", list(CONFIGS))
def test_kernel_agrees_with_the_emulator_sctp(wire: Wire, config: str) -> None:
    """Every case, under each configuration: the kernel's verdict is the emulator's, the
    endpoints reached (pod and DNATed port) are exactly those the emulator gives a positive
    probability, each saw the source address the emulator predicts, and every packet a pod
    received had a valid CRC32c (rewritten by NAT)."""
    asyncio.run(program(wire.topo.kernel, _render(CONFIGS[config])))
    emulator = load_emulator(CONFIGS[config], sctp_cluster())
    plans = []
    for case in CASES:
        want = predict(emulator, case)
        plans.append((case, want, wire.attempts(case, _count(case, want))))
    fates = wire.run([a for _, _, attempts in plans for a in attempts])
    problems = [
        p for case, want, attempts in plans if (p := _problem(case, want, [fates[a] for a in attempts]))
    ]
    assert not problems, "\n".join(problems)


def test_kernel_drops_a_bad_checksum(wire: Wire) -> None:
    """Control for the checksum: the same INITs to a ClusterIP, half with one checksum bit
    flipped. Conntrack finds the bad CRC32c at PREROUTING (``sctp_error``), so those packets
    are INVALID, never DNATed, and ``KUBE-FORWARD`` drops them: no pod gets them, no ICMP comes
    back. The good ones reach an endpoint, so the test's CRC32c is the kernel's. (The emulator
    does not model checksums; nothing is compared with it here.)"""
    asyncio.run(program(wire.topo.kernel, _render(CONFIGS["detect"])))
    case = BY_NAME["clusterip-from-pod"]
    good, bad = wire.attempts(case, 4), wire.attempts(case, 4, corrupt=True)
    fates = wire.run(good + bad)
    assert [fates[a].kind for a in good] == ["ACCEPT"] * 4
    assert [fates[a].kind for a in bad] == ["DROP"] * 4


def _conntrack_entry(wire: Wire, attempt: Attempt) -> tuple[str, int]:
    """State and seconds left of the node's conntrack entry of ``attempt`` (``conntrack -L``)."""
    out = sh("ip", "netns", "exec", wire.topo.names["node"], "conntrack", "-L", "-p", "sctp").stdout
    src = SOURCES[attempt.case.source][1]
    for line in out.splitlines():
        fields = line.split()
        if f"src={src}" in fields and f"sport={attempt.sport}" in fields:
            return fields[3], int(fields[2])
    raise AssertionError(f"no conntrack entry for {attempt} in:\n{out}")


#: How long the test waits before retransmitting an INIT (long against timing noise).
RETRANSMIT_AFTER_S = 2.0


def test_unreplied_init_conntrack_timeout(wire: Wire) -> None:
    """An INIT nobody answers: the kernel's entry is CLOSED with 10 s to live, and a
    retransmission of the INIT (same ports and tag) after :data:`RETRANSMIT_AFTER_S` goes to
    the same endpoint without renewing it; the emulator's entry lives as long (within the
    1 s resolution of ``conntrack -L`` and the time the test takes).

    The emulator has no chunk types or SCTP states; what it must get right is the timeout of an
    entry that has seen no reply, and that an unreplied SCTP entry is not refreshed by the
    client's own packets.
    """
    require_kernel("conntrack")
    config = CONFIGS["detect"]
    asyncio.run(program(wire.topo.kernel, _render(config)))
    case = BY_NAME["clusterip-from-pod"]
    (attempt,) = wire.attempts(case, 1)
    emulator = load_emulator(config, sctp_cluster())
    clock = emulator.clock
    assert isinstance(clock, ManualClock)
    packet = case_packet(case, attempt.sport)

    start = time.monotonic()
    first = wire.run([attempt], settle_s=0.2)[attempt]
    state1, left1 = _conntrack_entry(wire, attempt)
    read1 = time.monotonic() - start
    emulated1 = emulator.send(packet, random.Random(0))
    (entry,) = emulator.conntrack.entries()
    expect1 = entry.expires_s - clock.now()

    time.sleep(RETRANSMIT_AFTER_S)
    resend = time.monotonic()
    second = wire.run([attempt], settle_s=0.2)[attempt]
    state2, left2 = _conntrack_entry(wire, attempt)
    read2 = time.monotonic()
    clock.advance(resend - start)
    emulated2 = emulator.send(packet, random.Random(1))
    (entry,) = emulator.conntrack.entries()
    expect2 = entry.expires_s - clock.now()

    assert (first.kind, second.kind) == ("ACCEPT", "ACCEPT")
    assert first.arrivals[0].dst == second.arrivals[0].dst, "the retransmission follows the entry's DNAT"
    assert emulated1.destination == emulated2.destination
    assert (state1, state2) == ("CLOSED", "CLOSED")
    # ``conntrack -L`` prints whole seconds left, rounded down, at some moment of its run.
    assert expect1 - read1 - 1 <= left1 <= expect1, f"kernel {left1}s left, emulator {expect1}s"
    assert expect2 - (read2 - resend) - 1 <= left2 <= expect2, f"kernel {left2}s left, emulator {expect2}s"
