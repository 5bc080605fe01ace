"""What the iptables mode does beside the rules, on the emulated kernel and on Linux: stale UDP
conntrack entries are deleted after a sync that removed their endpoint (kube-proxy's
``CleanStaleEntries``), so a fixed-source-port flow moves to the new endpoint; and the first
full sync sets ``route_localnet`` (kube-proxy's ``sysctl`` for localhost NodePorts) unless
localhost NodePorts are off.

On Linux the flow is the harness's (:func:`tests.kernel.harness.topology`): a pod namespace
sends UDP datagrams from one source port to a ClusterIP, and the identity server that answers
names the endpoint; the emulated node is its mirror (:func:`tests.scenarios.node_model`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from emulation import ManualClock, Packet
from emulation.netfilter import Netns, Ruleset
from kproxy.kernel import EmulatedNetfilter, LinuxNetfilter, NetfilterKernel
from kproxy.kernel.conntrack import stale_conntrack_filters
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer
from kproxy.modes.iptables.mode import IptablesMode, program
from tests.kernel.conftest import Executor
from tests.kernel.harness import Probe, topology
from tests.kernel.netns import cleanup_stale, netns, sh
from tests.scenarios import EP_PORT, NODE_IP, PA, PB, POD_CLIENT, node_model
from tests.unit.modes.kube import endpoint_slice, ep, next_snapshot, service, snapshot_of

KERNEL_TOOLS = ("iptables-restore", "iptables-save", "iptables", "conntrack", "sysctl")

CIP = "172.30.0.77"
SPORT = 41234
CONFIG = IptablesConfig(node_ips=(NODE_IP,), cluster_cidr=("10.0.0.0/8",))
ROUTE_LOCALNET = "net.ipv4.conf.all.route_localnet"


def _docs(ip: str) -> list[dict[str, object]]:
    return [service("ns", "u", CIP, [{"name": "p", "port": 53, "protocol": "UDP", "targetPort": EP_PORT}]),
            endpoint_slice("ns", "u", [ep(ip, "node-a")], [("p", EP_PORT, "UDP")])]


@contextmanager
def _udp_client(executor: Executor) -> Iterator[tuple[NetfilterKernel, Callable[[], str | None]]]:
    """A kernel, and ``where()``: the endpoint the pod's next datagram (from :data:`SPORT`) reaches."""
    if executor is Executor.EMULATED:
        ns = Netns(node_model(), ManualClock(), ruleset=Ruleset(4))
        packet = Packet(src=POD_CLIENT, dst=CIP, sport=SPORT, dport=53, protocol="udp", in_interface="vp3")

        def sent() -> str | None:
            out = ns.send(packet, random.Random(1))
            return out.destination if out.verdict == "ACCEPT" else None

        yield EmulatedNetfilter(ns), sent
        return
    with topology() as node:
        probe = Probe(ns="pc", src=POD_CLIENT, dst=CIP, port=53, proto="udp", sport=SPORT, timeout_s=2.0)

        def answered() -> str | None:
            ((answer,),) = node.probe([probe])
            return answer.endpoint

        yield node.kernel, answered


def test_udp_flow_moves_to_the_new_endpoint_only_with_the_cleanup(executor: Executor) -> None:
    """Without the cleanup the flow's entry keeps DNATing to the removed endpoint; with it
    (the mode, after a successful sync) the flow moves."""
    first = snapshot_of(_docs(PA), hostname="node-a")
    second = next_snapshot(first, _docs(PB), hostname="node-a")
    with _udp_client(executor) as (kernel, where):
        mode = IptablesMode(CONFIG, kernel, now=lambda: 0.0)
        asyncio.run(mode.apply(first))
        assert where() == f"{PA}:{EP_PORT}"
        asyncio.run(program(kernel, IptablesRenderer(CONFIG).render(second, full=True)))
        assert where() == f"{PA}:{EP_PORT}"
        asyncio.run(mode.apply(second))
        assert where() == f"{PB}:{EP_PORT}"
        # Nothing left to delete: "0 flow entries" is not an error.
        assert asyncio.run(kernel.clear_conntrack(stale_conntrack_filters(first, second, CONFIG.family))) == 0


@contextmanager
def _fresh_node(executor: Executor, tag: str) -> Iterator[tuple[NetfilterKernel, Callable[[], bool]]]:
    """A kernel with ``route_localnet`` off, and a reading of it."""
    if executor is Executor.EMULATED:
        ns = Netns(replace(node_model(), route_localnet=False), ManualClock(), ruleset=Ruleset(4))
        yield EmulatedNetfilter(ns), lambda: ns.node.route_localnet
        return
    cleanup_stale()
    with netns(tag) as name:
        sh("ip", "netns", "exec", name, "sysctl", "-q", "-w", f"{ROUTE_LOCALNET}=0")
        read = ("ip", "netns", "exec", name, "sysctl", "-n", ROUTE_LOCALNET)
        yield LinuxNetfilter(netns=name, timeout_s=30.0), lambda: sh(*read).stdout.strip() == "1"


def test_first_full_sync_sets_route_localnet(executor: Executor) -> None:
    """With localhost NodePorts (the default) the first sync turns ``route_localnet`` on."""
    with _fresh_node(executor, "localnet") as (kernel, on):
        assert not on()
        asyncio.run(IptablesMode(CONFIG, kernel, now=lambda: 0.0).apply(snapshot_of([])))
        assert on()


def test_no_localhost_nodeports_leaves_route_localnet_off(executor: Executor) -> None:
    """With ``localhost_nodeports=False`` the sync leaves ``route_localnet`` as it was."""
    off = IptablesConfig(node_ips=(NODE_IP,), localhost_nodeports=False)
    with _fresh_node(executor, "nolocalnet") as (kernel, on):
        asyncio.run(IptablesMode(off, kernel, now=lambda: 0.0).apply(snapshot_of([])))
        assert not on()
