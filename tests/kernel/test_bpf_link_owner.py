"""Links belong to the process that made them: when the process holding a socket-LB link is
killed (SIGKILL, no cleanup), the kernel detaches the program, so nothing stays attached after
a crash. The holder is a real separate process; the clients run in a namespace and a cgroup the
test creates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.conftest import require_kernel
from tests.kernel.bpf_cgroup import cgroup, clients, server
from tests.kernel.netns import netns, sh

pytestmark = pytest.mark.kernel
KERNEL_TOOLS = ("nsenter",)
REPO = Path(__file__).resolve().parents[2]

_HOLDER = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
from kproxy.kernel.linux_bpf import LinuxBpf
from kproxy.model import IPFamily
from kproxy.modes.ebpf.datapath import SockLB
from tests.bpf_services import Svc, put
k = LinuxBpf()
lb = SockLB.load(k, (IPFamily.IPv4,), max_entries=64)
put(k, lb, Svc(vip="10.96.0.10", port=80, rev_nat_index=1, backends=((1, "127.0.0.1", 8080),)))
lb.attach(sys.argv[1])
print("attached", flush=True)
time.sleep(120)
"""


@pytest.fixture
def node() -> Iterator[tuple[str, str]]:
    """A namespace with a decoy on the Service address and the backend on loopback; a cgroup."""
    require_kernel(*KERNEL_TOOLS)
    with ExitStack() as stack:
        ns = stack.enter_context(netns("bpfowner"))
        sh("ip", "-n", ns, "addr", "add", "10.96.0.10/32", "dev", "lo")
        stack.enter_context(server(ns, "10.96.0.10", 80, "decoy"))
        stack.enter_context(server(ns, "127.0.0.1", 8080, "backend"))
        yield ns, stack.enter_context(cgroup("bpfowner"))


def test_killing_the_link_owner_detaches_its_programs(node: tuple[str, str]) -> None:
    """Translated while the holder lives; after SIGKILL of the holder, no longer."""
    ns, cg = node
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, cg, str(REPO)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline().strip()
        assert line == "attached", holder.stderr.read() if holder.stderr else line
        while_alive = clients(ns, "10.96.0.10", 80, cgroup_path=cg)[0]["reply"]
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
    after_kill = clients(ns, "10.96.0.10", 80, cgroup_path=cg)[0]["reply"]
    assert (while_alive, after_kill) == ("backend", "decoy")
