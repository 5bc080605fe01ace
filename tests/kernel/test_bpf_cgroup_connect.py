"""A cgroup connect4 program rewrites the destination through a hash map: a real TCP connect
from a process in the cgroup reaches the backend the BPF machine predicts; one outside is not
translated. Everything runs in a namespace and a cgroup the test creates."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emulation.bpf import AttachType, ProgType, SockAddr
from kproxy.kernel.bpf import BpfKernel, EmulatedBpf, ProgramSpec
from kproxy.kernel.linux_bpf import LinuxBpf
from tests.conftest import require_kernel
from tests.kernel.bpf_cgroup import cgroup, clients, server
from tests.kernel.bpf_programs import SERVICES, backend_value, connect4_dnat, service_key
from tests.kernel.netns import netns, sh

KERNEL_TOOLS = ("nsenter",)
VIP, VPORT, BACKEND, BPORT = "10.96.0.10", 80, "127.0.0.1", 8080


def _program(k: BpfKernel) -> tuple[int, int]:
    svc = k.create_map(SERVICES)
    k.update(svc, service_key(VIP, VPORT, 6), backend_value(BACKEND, BPORT))
    prog = k.load_program(ProgramSpec(type=ProgType.CGROUP_SOCK_ADDR, name="connect4",
                                      attach=AttachType.CGROUP_INET4_CONNECT,
                                      code=connect4_dnat().assemble({"svc": svc})))
    return svc, prog


def test_machine_predicts_the_rewrite_and_leaves_other_destinations() -> None:
    """On the machine the Service address becomes the backend; another port is left alone."""
    k = EmulatedBpf()
    _, prog = _program(k)
    k.attach_cgroup(prog, "/cg", AttachType.CGROUP_INET4_CONNECT)
    hit = k.run_sock_addr("/cg/child", SockAddr(attach=AttachType.CGROUP_INET4_CONNECT,
                                                user_ip=VIP, user_port=VPORT))
    miss = k.run_sock_addr("/cg", SockAddr(attach=AttachType.CGROUP_INET4_CONNECT,
                                           user_ip=VIP, user_port=81))
    outside = k.run_sock_addr("/other", SockAddr(attach=AttachType.CGROUP_INET4_CONNECT,
                                                 user_ip=VIP, user_port=VPORT))
    assert hit is not None and isinstance(hit.ctx, SockAddr)
    assert (hit.ret32, hit.ctx.user_ip, hit.ctx.user_port) == (1, BACKEND, BPORT)
    assert miss is not None and isinstance(miss.ctx, SockAddr) and miss.ctx.user_port == 81
    assert outside is None


def _seen(results: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in r.items() if k != "cookie"} for r in results]


@pytest.fixture
def node() -> Iterator[str]:
    """A namespace with the Service address on its loopback: a decoy answers there, the backend
    on 127.0.0.1:8080."""
    require_kernel(*KERNEL_TOOLS)
    with netns("bpfc4") as ns:
        sh("ip", "-n", ns, "addr", "add", f"{VIP}/32", "dev", "lo")
        with server(ns, VIP, VPORT, "decoy"), server(ns, BACKEND, BPORT, "backend"):
            yield ns


@pytest.mark.kernel
def test_real_connect_in_the_cgroup_reaches_the_predicted_backend(node: str) -> None:
    """A process in the cgroup connecting to the Service reaches the backend the machine
    predicted; a process outside the cgroup reaches the Service address itself."""
    emulated = EmulatedBpf()
    _, eprog = _program(emulated)
    emulated.attach_cgroup(eprog, "/cg", AttachType.CGROUP_INET4_CONNECT)
    predicted = emulated.run_sock_addr("/cg", SockAddr(attach=AttachType.CGROUP_INET4_CONNECT,
                                                       user_ip=VIP, user_port=VPORT))
    assert predicted is not None and isinstance(predicted.ctx, SockAddr)
    k = LinuxBpf()
    svc, prog = _program(k)
    try:
        with cgroup("connect4") as cg:
            link = k.attach_cgroup(prog, cg, AttachType.CGROUP_INET4_CONNECT)
            try:
                inside = _seen(clients(node, VIP, VPORT, cgroup_path=cg))
                outside = _seen(clients(node, VIP, VPORT))
            finally:
                k.close(link)
            after = _seen(clients(node, VIP, VPORT, cgroup_path=cg))
    finally:
        k.close(prog)
        k.close(svc)
    assert inside == [{"reply": "backend", "peer": f"{predicted.ctx.user_ip}:{predicted.ctx.user_port}"}]
    assert outside == [{"reply": "decoy", "peer": f"{VIP}:{VPORT}"}]
    assert after == [{"reply": "decoy", "peer": f"{VIP}:{VPORT}"}]  # closing the link detached it
