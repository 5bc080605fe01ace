"""A tc program linked at tcx ingress of a real device DNATs real packets: a UDP datagram from
another namespace to the Service reaches the backend socket with its checksums valid (the
client's datagrams carry full software checksums, so the receiver verifies them; a datagram
with a broken checksum is dropped, which shows the check is live). Closing the link detaches."""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from emulation.bpf import AttachType, ProgType
from kproxy.kernel.bpf import ProgramSpec
from kproxy.kernel.linux_bpf import LinuxBpf
from tests.conftest import require_kernel
from tests.kernel.bpf_programs import HITS, SERVICES, backend_value, service_key, tc_dnat
from tests.kernel.harness import CLONE_NEWNET, netns_socket
from tests.kernel.netns import netns, sh

pytestmark = pytest.mark.kernel
_T = TypeVar("_T")
_LIBC = ctypes.CDLL(None, use_errno=True)


def _in_netns(ns: str, fn: Callable[[], _T]) -> _T:
    """``fn()`` in a short-lived thread that entered ``ns`` (``BPF_LINK_CREATE`` resolves the
    ifindex in the caller's namespace)."""
    box: list[_T | BaseException] = []

    def run() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _LIBC.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({ns})")
            finally:
                os.close(fd)
            box.append(fn())
        except BaseException as e:  # handed to the caller
            box.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    if not box or isinstance(box[0], BaseException):
        raise box[0] if box else RuntimeError("the thread did not finish")
    return box[0]


def _csum(data: bytes) -> int:
    data += b"\x00" * (len(data) % 2)
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def _udp(src: str, dst: str, sport: int, dport: int, payload: bytes, *, broken: bool = False) -> bytes:
    hdr = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 17, 8 + len(payload))
    c = _csum(pseudo + hdr + payload) or 0xFFFF
    return hdr[:6] + ((c ^ 0x5555) if broken else c).to_bytes(2, "big") + payload


@pytest.fixture
def nodes() -> Iterator[tuple[str, str]]:
    """A client namespace and a node namespace joined by a veth; the backend on the node."""
    require_kernel()
    with netns("tcxc") as client, netns("tcxn") as node:
        sh("ip", "link", "add", "c0", "netns", client, "type", "veth", "peer", "name", "n0",
           "netns", node)
        sh("ip", "-n", client, "addr", "add", "10.0.0.1/24", "dev", "c0")
        sh("ip", "-n", node, "addr", "add", "10.0.0.2/24", "dev", "n0")
        sh("ip", "-n", node, "addr", "add", "10.244.2.7/32", "dev", "lo")
        for ns, dev in ((client, "c0"), (node, "n0")):
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", client, "route", "add", "10.96.0.0/16", "via", "10.0.0.2")
        sh("ip", "-n", client, "route", "add", "10.244.0.0/16", "via", "10.0.0.2")
        yield client, node


def _received(sock: socket.socket) -> bytes | None:
    try:
        return sock.recv(64)
    except TimeoutError:
        return None


def test_tcx_ingress_dnat_delivers_with_valid_checksums_and_detaches(nodes: tuple[str, str]) -> None:
    """Through the link the Service datagram reaches the backend; after closing it, it does not."""
    client, node = nodes
    k = LinuxBpf()
    svc, hits = k.create_map(SERVICES), k.create_map(HITS)
    backend = netns_socket(node, socket.SOCK_DGRAM)
    sender = netns_socket(client, socket.SOCK_RAW, socket.IPPROTO_UDP)
    try:
        backend.bind(("10.244.2.7", 5353))
        backend.settimeout(1.0)
        k.update(svc, service_key("10.96.0.10", 53, 17), backend_value("10.244.2.7", 5353))
        prog = k.load_program(ProgramSpec(type=ProgType.SCHED_CLS, name="tcx_dnat",
                                          code=tc_dnat().assemble({"svc": svc, "hits": hits})))
        try:
            ifindex = _in_netns(node, lambda: socket.if_nametoindex("n0"))
            link = _in_netns(node, lambda: k.attach_tcx(prog, ifindex, AttachType.TCX_INGRESS))
            try:
                sender.sendto(_udp("10.0.0.1", "10.96.0.10", 40000, 53, b"via-service"), ("10.96.0.10", 0))
                via_service = _received(backend)
                sender.sendto(_udp("10.0.0.1", "10.244.2.7", 40001, 5353, b"broken", broken=True),
                              ("10.244.2.7", 0))
                broken = _received(backend)
                counted = k.lookup(hits, bytes(4))
            finally:
                k.close(link)
            sender.sendto(_udp("10.0.0.1", "10.96.0.10", 40002, 53, b"after-close"), ("10.96.0.10", 0))
            after = _received(backend)
        finally:
            k.close(prog)
    finally:
        backend.close()
        sender.close()
        k.close(hits)
        k.close(svc)
    assert via_service == b"via-service"
    assert broken is None  # the receiver verifies checksums: a wrong one is dropped
    assert counted == (1).to_bytes(8, "little")
    assert after is None
