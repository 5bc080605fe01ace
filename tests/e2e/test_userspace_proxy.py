"""End-to-end tests of UserspaceProxy's reconciliation, address table and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from pathlib import Path

import pytest

from kproxy.errors import InvalidTransition
from kproxy.model import NodeConfig, Protocol, build_snapshot, parse_objects
from kproxy.userspace import AddressEntry, UserspaceProxy, allocate_addresses
from tests.e2e.backends import identify, read_line, service_port, snapshot, split, start_tcp_backend

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
