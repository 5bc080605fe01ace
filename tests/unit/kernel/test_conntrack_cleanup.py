"""Stale UDP/SCTP conntrack cleanup (kube-proxy's CleanStaleEntries): the pure filters and the
emulated kernel's deletion. The iptables mode calling it after a successful sync, moving a flow,
is ``tests/kernel/test_iptables_conntrack.py`` (on both executors)."""

from __future__ import annotations

import asyncio
import random

from emulation import Interface, ManualClock, Node, Packet, Route
from emulation.netfilter import Netns, Ruleset
from kproxy.kernel import EmulatedNetfilter
from kproxy.kernel.conntrack import ConntrackFilter, stale_conntrack_filters
from kproxy.model import IPFamily
from kproxy.modes.iptables import IptablesConfig
from kproxy.modes.iptables.mode import IptablesMode
from tests.unit.modes.kube import endpoint_slice, ep, next_snapshot, port, service, snapshot_of

V4 = IPFamily.IPv4


def _docs(eps: list[str], proto: str = "UDP") -> list[dict[str, object]]:
    ports = [port("p53", 53, proto, nodePort=30053)]
    docs: list[dict[str, object]] = [service("ns", "dns", "172.30.0.10", ports, type="NodePort",
                                             externalIPs=["1.2.3.4"])]
    if eps:
        docs.append(endpoint_slice("ns", "dns", [ep(ip) for ip in eps], [("p53", 53, proto)]))
    return docs


def test_removed_endpoint_filters_every_frontend_and_the_node_port() -> None:
    old = snapshot_of(_docs(["10.0.1.1", "10.0.1.2"]))
    new = next_snapshot(old, _docs(["10.0.1.2"]))
    got = {str(f) for f in stale_conntrack_filters(old, new, V4)}
    assert got == {
        "-f ipv4 -p udp --orig-dst 172.30.0.10 --orig-port-dst 53 --reply-src 10.0.1.1",
        "-f ipv4 -p udp --orig-dst 1.2.3.4 --orig-port-dst 53 --reply-src 10.0.1.1",
        "-f ipv4 -p udp --orig-port-dst 30053 --reply-src 10.0.1.1",
    }


def test_newly_active_service_flushes_undnatted_entries() -> None:
    old = snapshot_of(_docs([]))
    new = next_snapshot(old, _docs(["10.0.1.1"]))
    got = {str(f) for f in stale_conntrack_filters(old, new, V4)}
    assert got == {
        "-f ipv4 -p udp --orig-dst 172.30.0.10 --orig-port-dst 53 --reply-src 172.30.0.10",
        "-f ipv4 -p udp --orig-dst 1.2.3.4 --orig-port-dst 53 --reply-src 1.2.3.4",
        "-f ipv4 -p udp --orig-port-dst 30053",
    }
    # First sync: no NodePort-wide flush (a restart must not cut live flows).
    first = {str(f) for f in stale_conntrack_filters(None, new, V4)}
    assert "-f ipv4 -p udp --orig-port-dst 30053" not in first


def test_tcp_unchanged_and_sctp_cleaned() -> None:
    old = snapshot_of(_docs(["10.0.1.1"], "TCP"))
    assert stale_conntrack_filters(old, next_snapshot(old, _docs([], "TCP")), V4) == ()
    old = snapshot_of(_docs(["10.0.1.1"], "SCTP"))
    got = stale_conntrack_filters(old, next_snapshot(old, _docs([], "SCTP")), V4)
    assert got and all(f.protocol == "sctp" for f in got)


def test_deleted_service_cleans_its_endpoints() -> None:
    old = snapshot_of(_docs(["10.0.1.1"]))
    new = next_snapshot(old, [])
    assert any(f.reply_src == "10.0.1.1" and f.orig_dst == "172.30.0.10"
               for f in stale_conntrack_filters(old, new, V4))


def test_argv_is_kube_proxys_filter() -> None:
    f = ConntrackFilter(family=IPFamily.IPv6, protocol="udp", orig_dst="fd00::1", orig_dst_port=53,
                        reply_src="fd00::2")
    assert f.argv() == ("-D", "-f", "ipv6", "-p", "udp", "--orig-dst", "fd00::1", "--orig-port-dst", "53",
                        "--reply-src", "fd00::2")


def _node() -> Netns:
    node = Node(interfaces=(Interface(name="eth0", addresses=("192.168.0.2/24",)),),
                routes=(Route(destination="default", device="eth0"),))
    return Netns(node, ManualClock(), ruleset=Ruleset(4))


def _send(ns: Netns) -> str:
    out = ns.send(Packet(src="192.168.0.9", dst="172.30.0.10", sport=40000, dport=53, protocol="udp",
                            in_interface="eth0"), random.Random(1))
    return out.destination


def test_emulated_kernel_deletes_only_matching_entries() -> None:
    ns = _node()
    kernel = EmulatedNetfilter(ns)
    mode = IptablesMode(IptablesConfig(node_ips=("192.168.0.2",)), kernel, now=lambda: 0.0)
    asyncio.run(mode.apply(snapshot_of(_docs(["10.0.1.1"]))))
    _send(ns)
    keep = ConntrackFilter(family=V4, protocol="udp", orig_dst="172.30.0.10", reply_src="10.0.1.9")
    assert asyncio.run(kernel.clear_conntrack([keep])) == 0
    gone = ConntrackFilter(family=V4, protocol="udp", orig_dst_port=53, reply_src="10.0.1.1")
    assert asyncio.run(kernel.clear_conntrack([gone])) == 1
    assert ns.conntrack.entries() == []
