"""Socket-LB in the real kernel: kproxy's cgroup programs over Cilium's maps translate real TCP
and UDP clients in a test cgroup, as the BPF machine predicts. All traffic stays inside a
namespace the module creates (the Service addresses sit on its loopback, where decoys answer
when nothing is translated)."""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from emulation.bpf import AttachType, SockAddr
from kproxy.kernel.bpf import EmulatedBpf
from kproxy.kernel.linux_bpf import LinuxBpf
from kproxy.model import IPFamily
from kproxy.modes.ebpf.datapath import SockLB
from kproxy.modes.ebpf.layout import (
    AffinityKey,
    AffinityMatchKey,
    AffinityValue,
    Backend,
    ServiceFlag,
    backend_key,
)
from tests.bpf_services import Svc, put, remove
from tests.conftest import require_kernel
from tests.kernel.bpf_cgroup import cgroup, clients, server
from tests.kernel.harness import netns_socket
from tests.kernel.netns import netns, sh

pytestmark = pytest.mark.kernel
KERNEL_TOOLS = ("nsenter",)
SO_NETNS_COOKIE = 71  # asm-generic/socket.h

WEB = Svc(vip="10.96.0.10", port=80, rev_nat_index=1,
          backends=((1, "127.0.0.1", 8081), (2, "127.0.0.1", 8082), (3, "127.0.0.1", 8083)))
STICKY = Svc(vip="10.96.0.11", port=80, rev_nat_index=2, flags=ServiceFlag.AFFINITY,
             affinity_timeout_s=600,
             backends=((4, "127.0.0.1", 8081), (5, "127.0.0.1", 8082), (6, "127.0.0.1", 8083)))
EMPTY = Svc(vip="10.96.0.12", port=80, rev_nat_index=3)
DNS = Svc(vip="10.96.0.53", port=53, rev_nat_index=4, proto=17,
          backends=((7, "127.0.0.1", 5301), (8, "127.0.0.1", 5302)))
WEB6 = Svc(vip="fd00::10", port=80, rev_nat_index=5, backends=((9, "::1", 8091),))
ALL = (WEB, STICKY, EMPTY, DNS, WEB6)
REPLIES = {8081: "b1", 8082: "b2", 8083: "b3", 5301: "u1", 5302: "u2", 8091: "b6"}


class Node:
    """The namespace, the cgroup and the programs linked to it."""

    def __init__(self, ns: str, cg: str, k: LinuxBpf, lb: SockLB) -> None:
        self.ns, self.cg, self.k, self.lb = ns, cg, k, lb

    def run(self, host: str, port: int, *, proto: str = "tcp", count: int = 1,
            inside: bool = True) -> list[dict[str, object]]:
        return clients(self.ns, host, port, cgroup_path=self.cg if inside else "", proto=proto,
                       count=count)


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """Backends on loopback, decoys on the Service addresses, all programs on a new cgroup."""
    require_kernel(*KERNEL_TOOLS)
    with ExitStack() as stack:
        ns = stack.enter_context(netns("bpfsock"))
        for vip in ("10.96.0.10/32", "10.96.0.11/32", "10.96.0.12/32", "10.96.0.53/32"):
            sh("ip", "-n", ns, "addr", "add", vip, "dev", "lo")
        sh("ip", "-n", ns, "addr", "add", "fd00::10/128", "dev", "lo", "nodad")
        for vip in ("10.96.0.10", "10.96.0.11", "10.96.0.12", "fd00::10"):
            stack.enter_context(server(ns, vip, 80, "decoy"))
        stack.enter_context(server(ns, "10.96.0.53", 53, "decoy", udp=True))
        for port, answer in REPLIES.items():
            host = "::1" if port == 8091 else "127.0.0.1"
            stack.enter_context(server(ns, host, port, answer, udp=port in (5301, 5302)))
        cg = stack.enter_context(cgroup("socklb"))
        k = LinuxBpf()
        lb = SockLB.load(k, max_entries=1024)
        stack.callback(lb.close)
        for svc in ALL:
            put(k, lb, svc)
        lb.attach(cg)
        yield Node(ns, cg, k, lb)


def _replies(results: list[dict[str, object]]) -> set[object]:
    return {r.get("reply", r.get("error")) for r in results}


def test_tcp_connects_spread_over_the_backends_and_show_the_service_as_peer(node: Node) -> None:
    """60 connects reach all three backends; getpeername shows the Service address each time."""
    results = node.run(WEB.vip, 80, count=60)
    assert _replies(results) == {"b1", "b2", "b3"}
    assert {r["peer"] for r in results} == {"10.96.0.10:80"}


def test_a_service_without_backends_refuses_the_connect_with_ehostunreach(node: Node) -> None:
    """Cilium's answer for zero backends: the connect fails at once with EHOSTUNREACH."""
    assert node.run(EMPTY.vip, 80) == [{"error": errno.EHOSTUNREACH}]


def test_a_process_outside_the_cgroup_is_not_translated(node: Node) -> None:
    """Outside the cgroup the connect reaches the Service address itself (the decoy)."""
    assert [r["reply"] for r in node.run(WEB.vip, 80, count=3, inside=False)] == ["decoy"] * 3


def test_affinity_keeps_one_backend_for_the_namespace(node: Node) -> None:
    """With ClientIP affinity every connect from the namespace gets the same backend."""
    assert len(_replies(node.run(STICKY.vip, 80, count=15))) == 1


def test_affinity_holds_within_its_timeout_then_expires(node: Node) -> None:
    """An affinity entry for the namespace wins while fresh (its backend is not in any slot);
    once older than the timeout it is dropped and the slot's backend is chosen."""
    pinned = Svc(vip="10.96.0.13", port=80, rev_nat_index=6, flags=ServiceFlag.AFFINITY,
                 affinity_timeout_s=60, backends=((10, "127.0.0.1", 8081),))
    put(node.k, node.lb, pinned)
    fam = IPFamily.IPv4
    node.k.update(node.lb.fd(fam, "backends"), backend_key(11),
                  Backend(address="127.0.0.1", port=8083).pack())
    node.k.update(node.lb.fd(fam, "affinity_match"),
                  AffinityMatchKey(backend_id=11, rev_nat_id=6).pack(), b"\x01")
    probe = netns_socket(node.ns, socket.SOCK_STREAM)
    try:
        cookie = int.from_bytes(probe.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")
    finally:
        probe.close()
    key = AffinityKey(family=fam, rev_nat_id=6, netns_cookie=cookie).pack()
    affinity = node.lb.fd(fam, "affinity")
    try:
        node.k.update(affinity, key, AffinityValue(last_used=int(time.monotonic()), backend_id=11).pack())
        fresh = _replies(node.run(pinned.vip, 80, count=3))
        node.k.update(affinity, key, AffinityValue(last_used=int(time.monotonic()) - 120,
                                                   backend_id=11).pack())
        expired = _replies(node.run(pinned.vip, 80, count=3))
        renewed = AffinityValue.unpack(node.k.lookup(affinity, key) or bytes(16))
    finally:
        remove(node.k, node.lb, pinned)
    assert fresh == {"b3"} and expired == {"b1"} and renewed.backend_id == 10


def test_connected_udp_reaches_a_backend_and_shows_the_service(node: Node) -> None:
    """A connected UDP socket is translated at connect; its peer reads as the Service."""
    results = node.run(DNS.vip, 53, proto="udp", count=6)
    assert _replies(results) <= {"u1", "u2"} and {r["peer"] for r in results} == {"10.96.0.53:53"}


def test_unconnected_udp_goes_where_the_machine_predicts_and_replies_from_the_service(node: Node) -> None:
    """sendmsg4 picks slot cookie % count + 1; recvmsg4 shows the reply as from the Service.
    The machine, given the same socket cookie, predicts the backend that answered."""
    emulated = EmulatedBpf()
    elb = SockLB.load(emulated, (IPFamily.IPv4,), max_entries=64)
    put(emulated, elb, DNS)
    elb.attach("/cg")
    for r in node.run(DNS.vip, 53, proto="udp-unconnected", count=6):
        assert r["peer"] == "10.96.0.53:53"
        cookie = r["cookie"]
        assert isinstance(cookie, int)
        predicted = emulated.run_sock_addr("/cg", SockAddr(
            attach=AttachType.CGROUP_UDP4_SENDMSG, user_ip=DNS.vip, user_port=53, protocol=17,
            type=2, socket_cookie=cookie))
        assert predicted is not None and isinstance(predicted.ctx, SockAddr)
        assert r["reply"] == REPLIES[predicted.ctx.user_port]


def test_an_endpoint_removal_takes_effect_for_the_next_connects(node: Node) -> None:
    """After rewriting the Service with two backends, no connect reaches the removed one."""
    smaller = Svc(vip="10.96.0.10", port=80, rev_nat_index=1,
                  backends=((1, "127.0.0.1", 8081), (2, "127.0.0.1", 8082)))
    remove(node.k, node.lb, WEB)
    put(node.k, node.lb, smaller)
    try:
        assert _replies(node.run(WEB.vip, 80, count=30)) == {"b1", "b2"}
    finally:
        remove(node.k, node.lb, smaller)
        put(node.k, node.lb, WEB)


def test_connect6_translates_an_ipv6_service(node: Node) -> None:
    """The IPv6 program: fd00::10 port 80 reaches its backend on ::1, peer shown as the Service."""
    results = node.run(WEB6.vip, 80, count=2)
    assert [(r["reply"], r["peer"]) for r in results] == [("b6", "fd00::10:80")] * 2


def test_an_ipv6_socket_to_an_ipv4_mapped_service_is_translated(node: Node) -> None:
    """connect6 to ::ffff:10.96.0.10 reaches an IPv4 backend; the peer reads as the Service."""
    results = node.run("::ffff:10.96.0.10", 80, count=12)
    assert _replies(results) <= {"b1", "b2", "b3"} and len(_replies(results)) >= 2
    assert {r["peer"] for r in results} == {"::ffff:10.96.0.10:80"}
