"""Real kernel: stale UDP conntrack cleanup moves a fixed-source-port flow to the new endpoint,
and the first full sync sets ``route_localnet`` in the namespace."""

from __future__ import annotations

import asyncio

import pytest

from kproxy.kernel.conntrack import stale_conntrack_filters
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer
from kproxy.modes.iptables.mode import IptablesMode, program
from tests.conftest import require_kernel
from tests.kernel.harness import Probe, topology
from tests.kernel.netns import cleanup_stale, netns, sh
from tests.scenarios import EP_PORT, NODE_IP, PA, PB, POD_CLIENT
from tests.unit.modes.kube import endpoint_slice, ep, next_snapshot, service, snapshot_of

pytestmark = pytest.mark.kernel

CIP = "172.30.0.77"
CONFIG = IptablesConfig(node_ips=(NODE_IP,), cluster_cidr=("10.0.0.0/8",))


def _docs(ip: str) -> list[dict[str, object]]:
    return [service("ns", "u", CIP, [{"name": "p", "port": 53, "protocol": "UDP", "targetPort": EP_PORT}]),
            endpoint_slice("ns", "u", [ep(ip, "node-a")], [("p", EP_PORT, "UDP")])]


def test_udp_flow_moves_to_the_new_endpoint_only_with_the_cleanup() -> None:
    require_kernel("iptables-restore", "iptables-save", "iptables", "conntrack", "sysctl")
    with topology() as node:
        kernel = node.kernel
        mode = IptablesMode(CONFIG, kernel, now=lambda: 0.0)
        first = snapshot_of(_docs(PA), hostname="node-a")
        second = next_snapshot(first, _docs(PB), hostname="node-a")
        probe = Probe(ns="pc", src=POD_CLIENT, dst=CIP, port=53, proto="udp", sport=41234, timeout_s=2.0)

        def where() -> str | None:
            (answer,), = node.probe([probe])
            return answer.endpoint

        asyncio.run(mode.apply(first))
        assert where() == f"{PA}:{EP_PORT}"
        # Without the cleanup the entry keeps DNATing to the removed endpoint.
        asyncio.run(program(kernel, IptablesRenderer(CONFIG).render(second, full=True)))
        assert where() == f"{PA}:{EP_PORT}"
        # With it (through the mode, after a successful sync) the flow moves.
        asyncio.run(mode.apply(second))
        assert where() == f"{PB}:{EP_PORT}"
        # Nothing left to delete: "0 flow entries" is not an error.
        assert asyncio.run(kernel.clear_conntrack(stale_conntrack_filters(first, second, CONFIG.family))) == 0


def test_first_full_sync_sets_route_localnet() -> None:
    require_kernel("iptables-restore", "iptables-save", "iptables", "sysctl")
    cleanup_stale()
    from kproxy.kernel import LinuxNetfilter

    with netns("localnet") as ns:
        read = ("ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.conf.all.route_localnet")
        sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=0")
        assert sh(*read).stdout.strip() == "0"
        kernel = LinuxNetfilter(netns=ns, timeout_s=30.0)
        asyncio.run(IptablesMode(CONFIG, kernel, now=lambda: 0.0).apply(snapshot_of([])))
        assert sh(*read).stdout.strip() == "1"
    with netns("nolocalnet") as ns:
        read = ("ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.conf.all.route_localnet")
        kernel = LinuxNetfilter(netns=ns, timeout_s=30.0)
        off = IptablesConfig(node_ips=(NODE_IP,), localhost_nodeports=False)
        asyncio.run(IptablesMode(off, kernel, now=lambda: 0.0).apply(snapshot_of([])))
        assert sh(*read).stdout.strip() == "0"
