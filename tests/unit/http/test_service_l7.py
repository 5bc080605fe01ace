"""Which Service ports Istio's sidecar balances per request, and with which DestinationRule."""

from __future__ import annotations

import random
from typing import Any

from kproxy.model import (
    HashAlgorithm,
    HashKey,
    IPFamily,
    Protocol,
    ServicePortInfo,
    ServicePortName,
    parse_destination_rule,
)
from kproxy.modes.userspace.http.choosers import EnvoyChooser
from kproxy.modes.userspace.http.envoy_hash import HashRequest, xxh64
from kproxy.modes.userspace.http.envoy_lb import Maglev
from kproxy.modes.userspace.http.service_l7 import is_http_port, service_hash_policy


def _info(port_name: str = "http", app_protocol: str = "", protocol: Protocol = Protocol.TCP,
          namespace: str = "shop", port: int = 80) -> ServicePortInfo:
    spn = ServicePortName(namespace=namespace, name="cart", port=port_name, protocol=protocol)
    return ServicePortInfo(name=spn, family=IPFamily.IPv4, cluster_ip="10.96.0.9", port=port,
                           protocol=protocol, target_port=8080, app_protocol=app_protocol)


def _dr(name: str, host: str, namespace: str = "shop", **lb: Any) -> Any:
    dr, problems = parse_destination_rule({
        "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"host": host, "trafficPolicy": {"loadBalancer": {"consistentHash": lb}}}})
    assert problems == []
    return dr


def test_http_detection_by_app_protocol_or_name() -> None:
    """appProtocol http, or a port named http or http-*; not tcp, other names, or UDP."""
    assert is_http_port(_info("http")) and is_http_port(_info("http-web"))
    assert is_http_port(_info("x", "HTTP"))
    assert not is_http_port(_info("tcp")) and not is_http_port(_info("web"))
    assert not is_http_port(_info("http", protocol=Protocol.UDP))


def test_exact_host_beats_wildcard_and_short_names_resolve_in_the_rule_namespace() -> None:
    """``cart`` in namespace shop is cart.shop.svc.cluster.local; it beats ``*.shop.svc.cluster.local``."""
    wild = _dr("wild", "*.shop.svc.cluster.local", useSourceIp=True)
    short = _dr("short", "cart", httpHeaderName="x-user")
    elsewhere = _dr("elsewhere", "cart", namespace="other", httpHeaderName="x-other")
    policy = service_hash_policy(_info(), [wild, elsewhere, short])
    assert policy is not None and policy.key is HashKey.HEADER and policy.name == "x-user"
    assert service_hash_policy(_info(), [wild]).key is HashKey.SOURCE_IP  # type: ignore[union-attr]
    assert service_hash_policy(_info(), [elsewhere]) is None  # "cart" there means cart.other
    assert service_hash_policy(_info("tcp"), [short]) is None  # not HTTP: layer 4


def test_envoy_chooser_hashes_the_header_over_maglev_and_retries_with_an_offset() -> None:
    """The host is Maglev's entry for XXH64(header); attempt 1 uses Envoy's XOR offset."""
    policy = _dr("m", "cart", httpHeaderName="x-user",
                 maglev={"tableSize": 251}).load_balancer.consistent_hash
    assert policy.algorithm is HashAlgorithm.MAGLEV
    hosts = ["10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"]
    chooser = EnvoyChooser(hosts, policy, rng=random.Random(1))
    req = HashRequest(headers=(("X-User", "alice"),), path="/", remote=("10.1.1.1", 5),
                      local=("10.96.0.9", 80))
    table = Maglev(hosts, table_size=251)
    assert chooser.choose(req) == (table.choose(xxh64("alice")), ())
    assert chooser.choose(req, 1)[0] == table.choose(xxh64("alice"), 1)


def test_envoy_chooser_without_a_hash_is_random() -> None:
    """No header: Envoy draws a random hash, so requests spread over the hosts."""
    policy = _dr("m", "cart", httpHeaderName="x-user").load_balancer.consistent_hash
    chooser = EnvoyChooser(["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"], policy, rng=random.Random(5))
    req = HashRequest(headers=(), path="/", remote=("10.1.1.1", 5), local=("10.96.0.9", 80))
    assert len({chooser.choose(req)[0] for _ in range(60)}) == 3
