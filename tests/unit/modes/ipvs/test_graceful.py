"""Graceful termination and persistence end to end through the ipvs mode, with injected time."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from emulation import Interface, ManualClock, Node, Packet, Route
from kproxy.kernel.ipvs_node import IpvsNode
from kproxy.modes.ipvs import CHECK_INTERVAL_S, IpvsConfig
from kproxy.modes.ipvs.mode import IpvsMode
from tests.unit.modes.kube import endpoint_slice, ep, port, service, snapshot_of

VIP, A, B = "10.96.0.10", "10.180.0.1", "10.180.0.2"
CLIENT = "203.0.113.2"


def _node() -> tuple[IpvsNode, ManualClock]:
    clock = ManualClock()
    node = Node(interfaces=(Interface(name="eth0", addresses=("192.168.0.2/24",)),),
                routes=(Route(destination="default", device="eth0", via="192.168.0.1"),), route_localnet=True)
    return IpvsNode(node, clock), clock


def _docs(eps: list[str], proto: str = "TCP", **spec: object) -> list[dict[str, object]]:
    return [service("ns", "web", VIP, [port("http", 80, proto, targetPort=8080)], **spec),
            endpoint_slice("ns", "web", [ep(ip) for ip in eps], [("http", 8080, proto)])]


def _weights(node: IpvsNode) -> dict[str, int]:
    return {d.label: d.weight for d in node.ipvs.services()[0].dests}


def _syn(sport: int, proto: str = "tcp") -> Packet:
    return Packet(src=CLIENT, dst=VIP, sport=sport, dport=80, protocol=proto, in_interface="eth0")  # type: ignore[arg-type]


def _apply(mode: IpvsMode, docs: list[dict[str, object]], revision: int) -> None:
    asyncio.run(mode.apply(snapshot_of(docs, revision=revision)))


def test_removed_tcp_endpoint_drains_then_is_deleted() -> None:
    """A removed TCP endpoint with a connection goes to weight 0, keeps its connection, gets no new
    ones, and is deleted at the first one-minute check after its connection expired."""
    node, clock = _node()
    mode = IpvsMode.emulated(IpvsConfig(), node)
    _apply(mode, _docs([A, B]), 1)
    first = node.send(_syn(40000))
    held = first.destination
    node.send(replace(_syn(40000), syn=False), flags="A")           # established
    _apply(mode, _docs([A, B][:1] if held.startswith(B) else [B]), 2)
    assert _weights(node)[held] == 0 and len(mode.graceful.listed) == 1
    again = node.send(replace(_syn(40000), syn=False), flags="A")
    assert again.destination == held                                  # existing connection keeps it
    other = node.send(_syn(40001))
    assert other.destination != held                                 # new ones do not get it
    clock.advance(CHECK_INTERVAL_S)
    assert mode.tick() == [] and held in _weights(node)               # still busy
    clock.advance(900.0)                                              # ESTABLISHED timeout passes
    left = mode.tick()
    assert [x.dest for x in left] and held not in _weights(node) and not mode.graceful.listed


def test_removed_udp_endpoint_is_deleted_at_once() -> None:
    """UDP real servers are deleted immediately (IsRsGracefulTerminationNeeded is false for UDP)."""
    node, _ = _node()
    mode = IpvsMode.emulated(IpvsConfig(), node)
    _apply(mode, _docs([A, B], "UDP"), 1)
    held = node.send(_syn(40000, "udp")).destination
    keep = B if held.startswith(A) else A
    _apply(mode, _docs([keep], "UDP"), 2)
    assert list(_weights(node)) == [f"{keep}:8080"] and not mode.graceful.listed


def test_idle_endpoint_is_deleted_at_once() -> None:
    """A removed TCP endpoint without connections is deleted at once, not weighted to 0."""
    node, _ = _node()
    mode = IpvsMode.emulated(IpvsConfig(), node)
    _apply(mode, _docs([A, B]), 1)
    _apply(mode, _docs([A]), 2)
    assert _weights(node) == {f"{A}:8080": 1}


def test_returning_endpoint_leaves_the_termination_list() -> None:
    """An endpoint that comes back while draining is deleted and re-added at weight 1."""
    node, _ = _node()
    mode = IpvsMode.emulated(IpvsConfig(), node)
    _apply(mode, _docs([A, B]), 1)
    held = node.send(_syn(40000)).destination
    rest = [ip for ip in (A, B) if not held.startswith(ip)]
    _apply(mode, _docs(rest), 2)
    _apply(mode, _docs([A, B]), 3)
    assert _weights(node) == {f"{A}:8080": 1, f"{B}:8080": 1} and not mode.graceful.listed


def test_persistence_holds_for_the_affinity_timeout() -> None:
    """ClientIP affinity keeps a client on one endpoint until the template expires, then rr moves on."""
    node, clock = _node()
    mode = IpvsMode.emulated(IpvsConfig(), node)
    _apply(mode, _docs([A, B], sessionAffinity="ClientIP",
                       sessionAffinityConfig={"clientIP": {"timeoutSeconds": 30}}), 1)
    first = node.send(_syn(40000)).destination
    assert {node.send(_syn(40000 + i)).destination for i in range(1, 5)} == {first}
    clock.advance(200.0)                                              # connections and template expire
    assert node.send(_syn(41000)).destination != first


def test_deleted_service_removes_its_virtual_server_and_address() -> None:
    """A Service that goes away loses its virtual server and its kube-ipvs0 address (cleanLegacyService)."""
    node, _ = _node()
    mode = IpvsMode.emulated(IpvsConfig(), node)
    _apply(mode, _docs([A]), 1)
    assert node.bound == (VIP,)
    _apply(mode, [], 2)
    assert node.ipvs.services() == () and node.bound == ()
    assert node.send(_syn(40000)).verdict == "ACCEPT"                 # no longer local: forwarded
