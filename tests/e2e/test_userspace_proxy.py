"""End-to-end tests of UserspaceProxy's reconciliation, address table and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from kproxy.errors import InvalidTransition
from kproxy.model import NodeConfig, Protocol, build_snapshot, parse_objects
from kproxy.modes.userspace import AddressEntry, UserspaceProxy, allocate_addresses
from tests.e2e.backends import (
    identify,
    read_line,
    record_end,
    service_port,
    snapshot,
    split,
    start_tcp_backend,
    start_udp_backend,
)

# Moving to the pytest_asyncio_loop_factories hook needs a conftest change (tests/conftest.py).
pytestmark = pytest.mark.filterwarnings("ignore:Overriding the \"event_loop_policy\" fixture")


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Run every test on the stdlib loop and on uvloop (what `kproxy run` uses)."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.EventLoopPolicy()  # type: ignore[no-any-return]
    return asyncio.DefaultEventLoopPolicy()


async def test_address_map_file_written_atomically_on_change(tmp_path: Path) -> None:
    """The address table is written as JSON with exactly the documented keys, and rewritten on change."""
    path = tmp_path / "addresses.json"
    async with UserspaceProxy(address_map_path=path) as proxy:
        await proxy.apply(snapshot(service_port("web", "10.96.0.10", 80, []),
                                   service_port("dns", "10.96.0.53", 53, [], protocol=Protocol.UDP)))
        rows = json.loads(path.read_text())
        assert [set(r) for r in rows] == [{"service", "protocol", "cluster_ip", "port", "listen"}] * 2
        assert rows == [vars_of(e) for e in proxy.address_table()]
        assert {r["service"] for r in rows} == {"default/web", "default/dns"}
        await proxy.apply(snapshot(service_port("web", "10.96.0.10", 80, []), revision=2))
        assert [r["service"] for r in json.loads(path.read_text())] == ["default/web"]
        assert [p.name for p in tmp_path.iterdir()] == ["addresses.json"]  # no temp files left


def vars_of(entry: AddressEntry) -> dict[str, object]:
    """The dict form of an AddressEntry."""
    return {k: getattr(entry, k) for k in ("service", "protocol", "cluster_ip", "port", "listen")}


async def test_each_service_gets_its_own_loopback_address_and_ports() -> None:
    """Two Services get distinct loopback addresses, each listening on its own service port numbers."""
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(
            service_port("a", "10.96.0.1", 80, [], port_name="http"),
            service_port("a", "10.96.0.1", 443, [], port_name="https"),
            service_port("b", "10.96.0.2", 80, [], port_name="http"),
        ))
        table = {e.service: split(e.listen) for e in proxy.address_table()}
    assert table["default/a:http"] == (table["default/a:https"][0], 80)
    assert table["default/a:https"][1] == 443
    assert table["default/b:http"][1] == 80
    assert table["default/a:http"][0] != table["default/b:http"][0]
    assert all(ip.startswith("127.") and ip != "127.0.0.1" for ip, _ in table.values())


async def test_port_in_use_falls_back_to_a_free_port() -> None:
    """When the service port is taken on the Service's address, a free port on the same address is used."""
    ip = allocate_addresses(["10.96.9.9"])["10.96.9.9"]
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((ip, 8080))
        squatter.listen()
        async with UserspaceProxy() as proxy:
            await proxy.apply(snapshot(service_port("web", "10.96.9.9", 8080, [])))
            listen = proxy.listen_address("default/web")
    assert listen is not None
    host, port = split(listen)
    assert host == ip and port not in (8080, 0)


async def test_bind_address_gives_each_port_a_free_port() -> None:
    """With a bind_address every service port listens on that address on its own free port."""
    async with UserspaceProxy(bind_address="127.0.0.1") as proxy:
        await proxy.apply(snapshot(service_port("a", "10.96.0.1", 80, []),
                                   service_port("b", "10.96.0.2", 80, []),
                                   service_port("b", "10.96.0.2", 80, [], protocol=Protocol.UDP)))
        listens = [split(e.listen) for e in proxy.address_table()]
    assert {h for h, _ in listens} == {"127.0.0.1"}
    assert all(p != 80 for _, p in listens)
    tcp_ports = [split(e.listen)[1] for e in proxy.address_table() if e.protocol == "TCP"]
    assert len(set(tcp_ports)) == len(tcp_ports)


async def test_ipv6_service_port_listens_on_ipv6_loopback() -> None:
    """An IPv6 service port is served on ::1 and relays to its endpoint."""
    back = await start_tcp_backend("127.30.0.1")
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("v6", "fd00::10", 80, [back.endpoint()])))
        from kproxy.model import IPFamily

        listen = proxy.listen_address("default/v6", family=IPFamily.IPv6)
        assert listen is not None and listen.startswith("[::1]:")
        assert await identify(*split(listen)) == back.identity
    await back.aclose()


async def test_sctp_ports_are_skipped_and_others_served() -> None:
    """An SCTP service port is skipped while the other ports of the snapshot are served."""
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("s", "10.96.0.7", 9999, [], protocol=Protocol.SCTP),
                                   service_port("t", "10.96.0.8", 80, [])))
        assert [e.service for e in proxy.address_table()] == ["default/t"]


async def test_a_port_that_cannot_bind_does_not_stop_the_others() -> None:
    """A port whose listen address cannot be bound is logged and skipped; the other ports are served."""
    async with UserspaceProxy(bind_address="192.0.2.123") as proxy:  # TEST-NET, not on this host
        await proxy.apply(snapshot(service_port("a", "10.96.0.1", 80, [])))
        assert proxy.address_table() == []
    async with UserspaceProxy(loopback_block="127.77.0.0/30") as proxy:  # room for 2 Services only
        await proxy.apply(snapshot(service_port("a", "10.96.0.1", 80, []),
                                   service_port("b", "10.96.0.2", 80, []),
                                   service_port("c", "10.96.0.3", 80, [])))
        assert [e.service for e in proxy.address_table()] == ["default/a", "default/b"]


async def test_changed_cluster_ip_reopens_the_listener() -> None:
    """A service port whose ClusterIP changes gets a new listener (and a new address)."""
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("a", "10.96.0.1", 80, [])))
        before = proxy.listen_address("default/a")
        await proxy.apply(snapshot(service_port("a", "10.96.0.99", 80, []), revision=2))
        after = proxy.listen_address("default/a")
        assert [e.cluster_ip for e in proxy.address_table()] == ["10.96.0.99"]
    assert before != after


async def test_built_snapshot_from_manifests_is_served() -> None:
    """A Service and EndpointSlice parsed from API dicts are served through build_snapshot."""
    back = await start_tcp_backend("127.30.1.1")
    objs = parse_objects({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "demo"},
         "spec": {"clusterIP": "10.96.3.3", "ports": [{"name": "http", "port": 80,
                                                        "targetPort": back.port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "web-1", "namespace": "demo",
                      "labels": {"kubernetes.io/service-name": "web"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": back.port}],
         "endpoints": [{"addresses": [back.ip]}]},
    ]})
    assert not objs.problems, objs.problems
    from kproxy.model import EndpointSlice, Service

    snap = build_snapshot([o for o in objs.objects if isinstance(o, Service)],
                          [o for o in objs.objects if isinstance(o, EndpointSlice)], NodeConfig())
    async with UserspaceProxy() as proxy:
        await proxy.apply(snap)
        listen = proxy.listen_address("demo/web:http")
        assert listen is not None
        assert await identify(*split(listen)) == back.identity
    await back.aclose()


async def test_aclose_waits_for_connections_then_aborts_the_rest() -> None:
    """aclose lets a connection that ends within the drain timeout finish and aborts one that does not."""
    back = await start_tcp_backend("127.30.2.1")
    proxy = UserspaceProxy()
    await proxy.apply(snapshot(service_port("web", "10.96.4.4", 80, [back.endpoint()])))
    listen = proxy.listen_address("default/web")
    assert listen is not None
    polite_r, polite_w = await asyncio.open_connection(*split(listen))
    stuck_r, stuck_w = await asyncio.open_connection(*split(listen))
    assert await read_line(polite_r) == back.identity and await read_line(stuck_r) == back.identity

    async def finish_politely() -> None:
        await asyncio.sleep(0.05)
        polite_w.write(b"last words\n")
        assert await read_line(polite_r) == "last words"
        polite_w.close()

    async with asyncio.timeout(5), asyncio.TaskGroup() as tg:
        tg.create_task(finish_politely())
        tg.create_task(proxy.aclose(0.3))
    assert proxy.connections() == []
    async with asyncio.timeout(5):
        with contextlib.suppress(ConnectionResetError):
            assert await stuck_r.read() == b""  # aborted by the proxy
    stuck_w.close()
    with pytest.raises(InvalidTransition):
        await proxy.apply(snapshot())
    await back.aclose()


async def test_aclose_resets_connections_left_after_the_drain_timeout() -> None:
    """Connections still open when the drain timeout ends are reset on both sides, not closed cleanly."""
    back = await start_tcp_backend("127.30.3.1", handler=record_end)
    proxy = UserspaceProxy()
    await proxy.apply(snapshot(service_port("web", "10.96.4.5", 80, [back.endpoint()])))
    listen = proxy.listen_address("default/web")
    assert listen is not None
    reader, writer = await asyncio.open_connection(*split(listen))
    assert await read_line(reader) == back.identity
    async with asyncio.timeout(5):
        await proxy.aclose(0.05)
        with pytest.raises(ConnectionResetError):
            await reader.read()
        while not back.received:
            await asyncio.sleep(0.01)
    writer.close()
    await back.aclose()
    assert back.received == [b"reset"]


def _squat_tcp(ip: str, port: int) -> socket.socket:
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind((ip, port))
    squatter.listen()
    return squatter


async def test_tcp_and_udp_of_a_port_fall_back_to_one_port() -> None:
    """When a port number cannot be bound for TCP, its TCP and UDP ports fall back to one shared port."""
    ip = allocate_addresses(["10.96.9.53"])["10.96.9.53"]
    with _squat_tcp(ip, 53):
        async with UserspaceProxy() as proxy:
            await proxy.apply(snapshot(service_port("dns", "10.96.9.53", 53, [], port_name="dns-tcp"),
                                       service_port("dns", "10.96.9.53", 53, [], port_name="dns",
                                                    protocol=Protocol.UDP)))
            listens = {e.protocol: split(e.listen) for e in proxy.address_table()}
    assert listens["TCP"] == listens["UDP"]
    assert listens["TCP"][0] == ip and listens["TCP"][1] != 53


async def test_port_fallback_is_logged_with_service_and_ports() -> None:
    """A port that falls back logs a warning naming the service, the wanted port and the port used."""
    ip = allocate_addresses(["10.96.9.54"])["10.96.9.54"]
    with _squat_tcp(ip, 8053), capture_logs() as logs:
        async with UserspaceProxy() as proxy:
            await proxy.apply(snapshot(service_port("web", "10.96.9.54", 8053, [])))
            listen = proxy.listen_address("default/web")
    assert listen is not None
    warnings = [e for e in logs if e["event"] == "service port fell back to a free port"]
    assert [(e["log_level"], e["service"], e["wanted_port"], e["port"]) for e in warnings] == \
        [("warning", "default/web", 8053, split(listen)[1])]


async def test_port_added_beside_a_fallen_back_sibling_takes_its_port() -> None:
    """A UDP port added later beside a TCP port that fell back listens on the TCP port's number."""
    ip = allocate_addresses(["10.96.9.55"])["10.96.9.55"]
    tcp = service_port("dns", "10.96.9.55", 53, [], port_name="dns-tcp")
    udp = service_port("dns", "10.96.9.55", 53, [], port_name="dns", protocol=Protocol.UDP)
    with _squat_tcp(ip, 53):
        async with UserspaceProxy() as proxy:
            await proxy.apply(snapshot(tcp))
            await proxy.apply(snapshot(tcp, udp, revision=2))
            listens = {e.protocol: e.listen for e in proxy.address_table()}
    assert listens["TCP"] == listens["UDP"] and not listens["TCP"].endswith(":53")


async def test_bind_address_gives_tcp_and_udp_of_a_port_one_port() -> None:
    """With a bind_address, the TCP and UDP ports of one service port number get the same free port."""
    back = await start_udp_backend("127.30.4.1")
    async with UserspaceProxy(bind_address="127.0.0.1") as proxy:
        await proxy.apply(snapshot(service_port("dns", "10.96.0.53", 53, [], port_name="dns-tcp"),
                                   service_port("dns", "10.96.0.53", 53, [back.endpoint()], port_name="dns",
                                                protocol=Protocol.UDP)))
        listens = {e.protocol: e.listen for e in proxy.address_table()}
    back.close()
    assert listens["TCP"] == listens["UDP"]


async def test_address_map_file_is_readable_by_others(tmp_path: Path) -> None:
    """The address map file gets mode 0644 less the process umask, not the temp file's 0600."""
    path = tmp_path / "addresses.json"
    old = os.umask(0o022)
    try:
        async with UserspaceProxy(address_map_path=path) as proxy:
            await proxy.apply(snapshot(service_port("web", "10.96.0.10", 80, [])))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
