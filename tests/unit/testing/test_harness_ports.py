# ruff: noqa: E501  (test names are kept whole to stay readable)
"""The in-process cluster's port naming: a port by number or by name, and a family for dual-stack ports."""

from __future__ import annotations

import pytest

from kproxy.model import IPFamily, NodeConfig
from kproxy.testing import InProcessCluster
from kproxy.testing.harness import in_process_cluster


async def test_a_two_port_service_is_served_by_number_by_name_and_by_its_bare_name(kproxy_cluster: InProcessCluster) -> None:
    """add_service returns ns/name; request takes it (first port), ns/name:NUMBER and ns/name:pNUMBER."""
    web = await kproxy_cluster.add_service("shop/web", (80, 8443), replicas=3)
    assert web == "shop/web"
    first = set(await kproxy_cluster.scale("shop/web:80", 3))
    tls = await kproxy_cluster.scale("shop/web:p8443", 1)
    assert await kproxy_cluster.request(web) in first
    assert await kproxy_cluster.request("shop/web:80") in first
    assert await kproxy_cluster.request("shop/web:p80") in first
    assert {await kproxy_cluster.request("shop/web:8443") for _ in range(2)} == set(tls)
    assert kproxy_cluster.address("shop/web:8443") == kproxy_cluster.address("shop/web:p8443")
    assert kproxy_cluster.address(web) != kproxy_cluster.address("shop/web:8443")


async def test_an_unknown_port_is_a_lookup_error_listing_the_ports(kproxy_cluster: InProcessCluster) -> None:
    """A port the Service does not have raises LookupError naming both spellings of each port."""
    await kproxy_cluster.add_service("shop/web", (80, 8443))
    with pytest.raises(LookupError, match=r"no port '9090'.*shop/web:80 or shop/web:p80"):
        kproxy_cluster.address("shop/web:9090")


async def test_a_service_port_named_through_the_source_is_found_by_name_or_number(kproxy_cluster: InProcessCluster) -> None:
    """A Service added through .source with a port named http is addressed as ns/name:http or ns/name:8080."""
    kproxy_cluster.source.add_service("demo/api", "10.97.200.1", [{"name": "http", "port": 8080}])
    await kproxy_cluster.sync()
    assert kproxy_cluster.address("demo/api:http") == kproxy_cluster.address("demo/api:8080")
    assert kproxy_cluster.address("demo/api") == kproxy_cluster.address("demo/api:http")
    with pytest.raises(LookupError, match="demo/api:http"):
        kproxy_cluster.address("demo/api:grpc")


async def test_listen_address_takes_a_family_for_a_dual_stack_port() -> None:
    """A dual-stack Service listens on 127.x for IPv4 and on ::1 for IPv6; family picks one, default IPv4."""
    node = NodeConfig(hostname="node-a", ip_families=(IPFamily.IPv4, IPFamily.IPv6))
    async with in_process_cluster(node=node) as cluster:
        cluster.source.add_service("demo/dual", ["10.97.210.1", "fd00:10:97::1"], (80,),
                                   ipFamilies=["IPv4", "IPv6"], ipFamilyPolicy="RequireDualStack")
        await cluster.sync()
        v4, v6 = cluster.address("demo/dual", family="IPv4"), cluster.address("demo/dual", family=IPFamily.IPv6)
        assert v4[0].startswith("127.") and v6[0] == "::1"
        assert cluster.address("demo/dual") == v4
        assert cluster.running.listen_address("demo/dual", "TCP", "IPv6") == v6
        with pytest.raises(LookupError, match="IPv6"):
            cluster.address("demo/dual", "UDP", family="IPv6")
