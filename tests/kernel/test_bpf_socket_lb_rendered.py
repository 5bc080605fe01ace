"""The renderer's maps in the real kernel: a rendered Service reaches every endpoint through
socket-LB, one partial sync removing an endpoint takes effect for the next connects, and a
rendered Service without endpoints refuses with EHOSTUNREACH. In a namespace and a cgroup the
test creates; the endpoints are loopback addresses there."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from kproxy.kernel.linux_bpf import LinuxBpf
from kproxy.modes.ebpf import MapState
from kproxy.modes.ebpf.datapath import SockLB
from tests.bpf_rendered import NODE, web_snapshot
from tests.conftest import require_kernel
from tests.kernel.bpf_cgroup import cgroup, clients, server
from tests.kernel.netns import netns, sh

pytestmark = pytest.mark.kernel
KERNEL_TOOLS = ("nsenter",)
ENDPOINTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@pytest.fixture
def node() -> Iterator[tuple[str, str]]:
    """The namespace (endpoints answer their own address, a decoy the Service's) and a cgroup."""
    require_kernel(*KERNEL_TOOLS)
    with ExitStack() as stack:
        ns = stack.enter_context(netns("bpfrender"))
        for vip in ("10.96.0.10/32", "10.96.0.12/32"):
            sh("ip", "-n", ns, "addr", "add", vip, "dev", "lo")
        for vip in ("10.96.0.10", "10.96.0.12"):
            stack.enter_context(server(ns, vip, 80, "decoy"))
        for address in ENDPOINTS:
            stack.enter_context(server(ns, address, 8080, address))
        yield ns, stack.enter_context(cgroup("bpfrender"))


def test_rendered_maps_translate_real_connects_and_follow_a_partial_sync(node: tuple[str, str]) -> None:
    """All endpoints answer; after one sync without 127.0.0.4 it never does; count 0 refuses."""
    ns, cg = node
    state = MapState(config=NODE)
    lb = SockLB.load(LinuxBpf(), max_entries=1024)
    try:
        lb.apply(state.sync(web_snapshot(ENDPOINTS, revision=1)))
        lb.attach(cg)
        before = {r.get("reply") for r in clients(ns, "10.96.0.10", 80, cgroup_path=cg, count=45)}
        lb.apply(state.sync(web_snapshot(ENDPOINTS[:2], revision=2)))
        after = clients(ns, "10.96.0.10", 80, cgroup_path=cg, count=30)
        empty = clients(ns, "10.96.0.12", 80, cgroup_path=cg)
    finally:
        lb.close()
    assert before == set(ENDPOINTS)
    assert {r.get("reply") for r in after} == set(ENDPOINTS[:2])
    assert {r["peer"] for r in after} == {"10.96.0.10:80"}
    assert empty == [{"error": errno.EHOSTUNREACH}]
