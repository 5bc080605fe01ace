"""Service ports with an Istio DestinationRule consistentHash: `kproxy run` balances each request as Envoy."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
import xxhash

from kproxy.modes.userspace.http.envoy_lb import Maglev, RingHash
from tests.e2e.l7 import Kproxy, Pods, http_pods, kproxy_run, service_docs, wait_until, write_manifests


def _dr(name: str, host: str, lb: dict[str, Any],
        port_level: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    policy: dict[str, Any] = {"loadBalancer": lb}
    if port_level:
        policy["portLevelSettings"] = port_level
    return {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"host": host, "trafficPolicy": policy}}


def _docs(pods: Pods) -> list[dict[str, Any]]:
    return [
        *service_docs("users", "10.96.64.10", pods.ips, pods.port, port_name="http-api"),
        *service_docs("carts", "10.96.64.11", pods.ips, pods.port, port_name="web", app_protocol="http"),
        *service_docs("raw", "10.96.64.12", pods.ips, pods.port, port_name="tcp"),
        _dr("users", "users",
            {"consistentHash": {"httpHeaderName": "x-user", "maglev": {"tableSize": 1009}}}),
        _dr("carts", "carts.default.svc.cluster.local", {"simple": "ROUND_ROBIN"}, port_level=[
            {"port": {"number": 80}, "loadBalancer": {"consistentHash": {
                "httpCookie": {"name": "cart", "path": "/", "ttl": "30s"},
                "ringHash": {"minimumRingSize": 64}}}}]),
        _dr("raw", "raw", {"consistentHash": {"useSourceIp": True}}),
    ]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kproxy, Pods, dict[str, str]]]:
    """Pods, kproxy with the DestinationRules, and where each Service listens."""
    tmp = tmp_path_factory.mktemp("istio")
    with http_pods(3, "127.0.64.1") as pods:
        manifests = tmp / "cluster.yaml"
        write_manifests(manifests, _docs(pods))
        amap = tmp / "addresses.json"
        with kproxy_run(manifests, tmp, "--address-map", str(amap)) as kp:
            rows = wait_until(lambda: amap.exists() and len(json.loads(amap.read_text())) == 3 and
                              json.loads(amap.read_text()))
            yield kp, pods, {r["service"].split("/")[1].split(":")[0]: r["listen"] for r in rows}


def _ask(listen: str, headers: dict[str, str]) -> tuple[str, str | None]:
    host, port = listen.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", "/", headers=headers)
        resp = conn.getresponse()
        resp.read()
        return str(resp.getheader("X-Pod")), resp.getheader("Set-Cookie")
    finally:
        conn.close()


def _pod_by_endpoint(pods: Pods) -> dict[str, str]:
    return {f"{ip}:{pods.port}": pod for pod, ip in pods.ips.items()}


def test_header_hash_over_maglev_picks_envoy_s_host_for_every_request(
        stack: tuple[Kproxy, Pods, dict[str, str]]) -> None:
    """x-user: the same user always reaches the pod Envoy's Maglev table gives XXH64(user)."""
    _, pods, listen = stack
    table = Maglev(sorted(_pod_by_endpoint(pods)), table_size=1009)
    seen = set()
    for user in ("alice", "bob", "carol", "dave", "erin", "frank"):
        expected = _pod_by_endpoint(pods)[table.choose(xxhash.xxh64_intdigest(user.encode()))]
        got = {_ask(listen["users"], {"x-user": user})[0] for _ in range(5)}
        assert got == {expected}
        seen.add(expected)
    assert len(seen) > 1


def test_generated_cookie_on_a_port_level_ring_hash(stack: tuple[Kproxy, Pods, dict[str, str]]) -> None:
    """appProtocol http + port-level httpCookie with ttl: Envoy's cookie is set and then followed."""
    _, pods, listen = stack
    first_pod, cookie = _ask(listen["carts"], {})
    assert cookie is not None and cookie.startswith('cart="')
    assert cookie.endswith("; Max-Age=30; Path=/; HttpOnly")
    value = cookie.split('"')[1]
    ring = RingHash(sorted(_pod_by_endpoint(pods)), min_ring_size=64)
    assert first_pod == _pod_by_endpoint(pods)[ring.choose(xxhash.xxh64_intdigest(value.encode()))]
    again = {_ask(listen["carts"], {"Cookie": f'cart="{value}"'}) for _ in range(10)}
    assert again == {(first_pod, None)}


def test_a_tcp_named_port_stays_layer_4(stack: tuple[Kproxy, Pods, dict[str, str]]) -> None:
    """A port named ``tcp`` is not HTTP for Istio: round robin per connection, whatever the rule says."""
    listen = stack[2]
    got = {_ask(listen["raw"], {})[0] for _ in range(9)}
    assert len(got) == 3
