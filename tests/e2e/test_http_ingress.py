"""`kproxy run --ingress-bind-address` with real clients: curl, http.cookiejar, http.client, websockets."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import http.cookiejar
import random
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.modes.userspace.http.sticky import backend_key
from tests.e2e.l7 import (
    Kproxy,
    Pods,
    get,
    http_pods,
    ingress_doc,
    kproxy_run,
    rule,
    service_docs,
    wait_until,
    write_manifests,
)

A = "nginx.ingress.kubernetes.io/"
SHOP = "shop.example.com"
PERSIST = "persist.example.com"
MIB = 1 << 20


def _docs(pods: Pods, *, web_pods: dict[str, str] | None = None) -> list[dict[str, Any]]:
    web = web_pods if web_pods is not None else {k: v for k, v in pods.ips.items() if k != "pod-3"}
    return [
        *service_docs("web", "10.96.61.10", web, pods.port),
        *service_docs("other", "10.96.61.11", {"pod-3": pods.ips["pod-3"]}, pods.port),
        *service_docs("webp", "10.96.61.12", web, pods.port),
        *service_docs("empty", "10.96.61.13", {}, pods.port),
        *service_docs("flaky", "10.96.61.14", {"dead": "127.0.61.99", "pod-2": pods.ips["pod-2"]}, pods.port),
        ingress_doc("shop", [rule(SHOP, ("/", "Prefix", "web", 80), ("/exact", "Exact", "other", "http"),
                                  ("/impl", "ImplementationSpecific", "other", 80),
                                  ("/api", "Prefix", "other", 80))],
                    annotations={A + "affinity": "cookie", A + "session-cookie-name": "route",
                                 A + "session-cookie-max-age": "3600", A + "session-cookie-samesite": "Lax"}),
        ingress_doc("persist", [rule(PERSIST, ("/", "Prefix", "webp", 80))],
                    annotations={A + "affinity": "cookie", A + "affinity-mode": "persistent"}),
        ingress_doc("misc", [rule("empty.example.com", ("/", "Prefix", "empty", 80)),
                             rule("flaky.example.com", ("/", "Prefix", "flaky", 80)),
                             rule("*.wild.example.com", ("/", "Prefix", "other", 80)),
                             rule(None, ("/ws", "Exact", "web", 80))]),
        ingress_doc("foreign", [rule("foreign.example.com", ("/", "Prefix", "web", 80))],
                    ingress_class="haproxy"),
    ]


@pytest.fixture(scope="module")
def pods() -> Iterator[Pods]:
    """Four HTTP pods on 127.0.61.1-4."""
    with http_pods(4, "127.0.61.1") as p:
        yield p


@pytest.fixture(scope="module")
def stack(pods: Pods, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kproxy, Path]]:
    """kproxy serving the Ingresses above; yields it and its manifests file."""
    tmp = tmp_path_factory.mktemp("l7")
    manifests = tmp / "cluster.yaml"
    write_manifests(manifests, _docs(pods))
    with kproxy_run(manifests, tmp) as kp:
        wait_until(lambda: get(kp.url("/"), headers={"Host": SHOP})[0] == 200)
        yield kp, manifests


def _curl(kp: Kproxy, jar: Path, host: str, n: int, *extra: str) -> list[str]:
    urls = [kp.url("/")] * n
    out = subprocess.run(["curl", "-s", "--max-time", "20", "-H", f"Host: {host}", "-c", str(jar),
                          "-b", str(jar),
                          *extra, *urls], capture_output=True, text=True, timeout=30, check=True).stdout
    return re.findall(r"pod=(pod-\d)", out)


def test_curl_with_a_cookie_jar_stays_on_one_pod_for_100_requests(stack: tuple[Kproxy, Path],
                                                                   tmp_path: Path) -> None:
    """curl keeps the balanced cookie and every one of 100 keep-alive requests reaches the same pod."""
    kp, _ = stack
    jar = tmp_path / "jar.txt"
    served = _curl(kp, jar, SHOP, 100)
    assert len(served) == 100 and len(set(served)) == 1
    line = next(ln for ln in jar.read_text().splitlines() if "\troute\t" in ln)
    value = line.split("\t")[-1]
    key, suffix = value.split("|")
    assert suffix == backend_key("default-web-80")
    assert re.fullmatch(r"\d+(\.\d+)?\.\d+\.\d{1,6}", key)


def test_set_cookie_has_the_asked_attributes_in_lua_resty_cookie_order(stack: tuple[Kproxy, Path]) -> None:
    """Max-Age, Path (the location), HttpOnly and SameSite, in that order."""
    kp, _ = stack
    status, headers, _ = get(kp.url("/"), headers={"Host": SHOP})
    assert status == 200
    assert re.fullmatch(r"route=[^;]+\|[0-9a-f]{32}; Max-Age=3600; Path=/; HttpOnly; SameSite=Lax",
                        headers["Set-Cookie"])


def _opener() -> tuple[urllib.request.OpenerDirector, http.cookiejar.CookieJar]:
    jar = http.cookiejar.CookieJar()
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar)), jar


def _pod_of(opener: urllib.request.OpenerDirector, kp: Kproxy, host: str) -> str:
    req = urllib.request.Request(kp.url("/"), headers={"Host": host})
    with opener.open(req, timeout=5) as resp:
        return str(resp.headers["X-Pod"])


def test_cookiejar_sticks_then_rebalances_when_the_pod_goes(stack: tuple[Kproxy, Path], pods: Pods) -> None:
    """Balanced: the same cookie follows a ring neighbour once its pod leaves, and stays there."""
    kp, manifests = stack
    opener, jar = _opener()
    first = {_pod_of(opener, kp, SHOP) for _ in range(100)}
    assert len(first) == 1
    (pinned,) = first
    cookie_before = next(c.value for c in jar if c.name == "route")
    write_manifests(manifests, _docs(pods, web_pods={k: v for k, v in pods.ips.items()
                                                     if k not in (pinned, "pod-3")}))
    try:
        wait_until(lambda: _pod_of(opener, kp, SHOP) != pinned)
        after = {_pod_of(opener, kp, SHOP) for _ in range(50)}
        assert len(after) == 1 and pinned not in after
        assert next(c.value for c in jar if c.name == "route") == cookie_before  # never rewritten
    finally:
        write_manifests(manifests, _docs(pods))
        wait_until(lambda: len({get(kp.url("/"), headers={"Host": SHOP})[1]["X-Pod"]
                                for _ in range(30)}) == 3)


def test_persistent_cookie_moves_with_a_new_cookie_when_its_pod_goes(stack: tuple[Kproxy, Path],
                                                                      pods: Pods) -> None:
    """Persistent: a stale key picks a new pod and sets a new md5 cookie, which then sticks."""
    kp, manifests = stack
    opener, jar = _opener()
    pinned = _pod_of(opener, kp, PERSIST)
    key = next(c.value for c in jar if c.name == "INGRESSCOOKIE").split("|")[0]
    assert key == hashlib.md5(f"default-webp-80{pods.ips[pinned]}:{pods.port}".encode()).hexdigest()
    write_manifests(manifests, _docs(pods, web_pods={k: v for k, v in pods.ips.items()
                                                     if k not in (pinned, "pod-3")}))
    try:
        moved = wait_until(lambda: (p := _pod_of(opener, kp, PERSIST)) != pinned and p)
        new_key = next(c.value for c in jar if c.name == "INGRESSCOOKIE").split("|")[0]
        assert new_key == hashlib.md5(f"default-webp-80{pods.ips[moved]}:{pods.port}".encode()).hexdigest()
        assert {_pod_of(opener, kp, PERSIST) for _ in range(30)} == {moved}
    finally:
        write_manifests(manifests, _docs(pods))


def test_tampered_cookie_is_routed_but_only_persistent_mode_replaces_it(stack: tuple[Kproxy, Path]) -> None:
    """Balanced maps any key somewhere without a new cookie; persistent finds nothing and sets one."""
    kp, _ = stack
    status, headers, _ = get(kp.url("/"), headers={"Host": SHOP, "Cookie": "route=evil|deadbeef"})
    assert status == 200 and "Set-Cookie" not in headers
    repeat = {get(kp.url("/"), headers={"Host": SHOP, "Cookie": "route=evil|deadbeef"})[1]["X-Pod"]
              for _ in range(10)}
    assert len(repeat) == 1
    status, headers, _ = get(kp.url("/"), headers={"Host": PERSIST, "Cookie": "INGRESSCOOKIE=evil|x"})
    assert status == 200 and headers["Set-Cookie"].startswith("INGRESSCOOKIE=")


def test_503_without_endpoints_and_404_when_nothing_matches(stack: tuple[Kproxy, Path]) -> None:
    """A Service with no endpoints answers 503; an unknown host or another class's Ingress, 404."""
    kp, _ = stack
    assert get(kp.url("/"), headers={"Host": "empty.example.com"})[0] == 503
    status, _, body = get(kp.url("/"), headers={"Host": "nobody.example.org"})
    assert status == 404 and b"<center><h1>404 Not Found</h1></center>" in body
    assert get(kp.url("/"), headers={"Host": "foreign.example.com"})[0] == 404


def test_paths_exact_prefix_implementation_specific_longest_and_wildcard(stack: tuple[Kproxy, Path]) -> None:
    """Exact, element-wise Prefix, nginx-prefix ImplementationSpecific, the longest match, wildcard hosts."""
    kp, _ = stack

    def pod(path: str, host: str = SHOP) -> str | None:
        return get(kp.url(path), headers={"Host": host})[1].get("X-Pod")

    assert pod("/exact") == "pod-3"  # the other Service has pod-3 alone; web has pod-0..2
    assert pod("/exact/more") != "pod-3"  # Exact: only the path itself; Prefix / takes the rest
    assert pod("/implementation") == "pod-3"  # ImplementationSpecific /impl is a plain prefix
    assert pod("/api/v1") == "pod-3" and pod("/api") == "pod-3"
    assert pod("/apiary") != "pod-3"  # Prefix /api is element-wise: /apiary falls to /
    assert pod("/", "a.b.wild.example.com:8080") == "pod-3"
    assert pod("/", "wild.example.com") is None  # the wildcard needs a label before it: 404


def test_forwarded_headers_as_ingress_nginx_sets_them(stack: tuple[Kproxy, Path]) -> None:
    """X-Forwarded-For is the client address, X-Request-ID is kept or made, Host is passed."""
    import json
    kp, _ = stack
    _, _, body = get(kp.url("/headers"), headers={"Host": SHOP, "X-Forwarded-For": "1.2.3.4",
                                                  "X-Request-ID": "abc123"})
    seen = json.loads(body)["headers"]
    assert seen["Host"] == SHOP and seen["X-Forwarded-Host"] == SHOP
    assert seen["X-Real-IP"] == "127.0.0.1" and seen["X-Forwarded-For"] == "127.0.0.1"
    assert seen["X-Original-Forwarded-For"] == "1.2.3.4"
    assert seen["X-Forwarded-Proto"] == "http" and seen["X-Request-ID"] == "abc123"
    assert seen["X-Forwarded-Port"] == kp.listen.rsplit(":", 1)[1]
    _, _, body = get(kp.url("/headers"), headers={"Host": SHOP})
    assert re.fullmatch(r"[0-9a-f]{32}", json.loads(body)["headers"]["X-Request-ID"])


def test_connect_errors_are_retried_on_another_endpoint(stack: tuple[Kproxy, Path]) -> None:
    """An endpoint that refuses connections is skipped within the request (proxy_next_upstream)."""
    kp, _ = stack
    results = {get(kp.url("/"), headers={"Host": "flaky.example.com"})[1].get("X-Pod") for _ in range(20)}
    assert results == {"pod-2"}


def test_an_upstream_reset_mid_response_cuts_the_client_and_the_next_request_works(
        stack: tuple[Kproxy, Path]) -> None:
    """The client sees a short body (no silent success), and the listener keeps serving."""
    kp, _ = stack
    conn = http.client.HTTPConnection(kp.listen, timeout=5)
    conn.request("GET", "/reset", headers={"Host": SHOP})
    resp = conn.getresponse()
    assert resp.status == 200
    with pytest.raises(http.client.IncompleteRead):
        resp.read()
    conn.close()
    assert get(kp.url("/"), headers={"Host": SHOP})[0] == 200


def test_200_concurrent_keep_alive_clients(stack: tuple[Kproxy, Path]) -> None:
    """200 connections at once, five keep-alive requests each, all answered."""
    kp, _ = stack
    host, port = kp.listen.split(":")

    async def client(i: int) -> int:
        reader, writer = await asyncio.open_connection(host, int(port))
        ok = 0
        try:
            for _ in range(5):
                writer.write(f"GET /c{i} HTTP/1.1\r\nHost: {SHOP}\r\n\r\n".encode())
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
                await reader.readexactly(length)
                ok += head.startswith(b"HTTP/1.1 200") and b"Connection: keep-alive" in head
        finally:
            writer.close()
        return ok

    async def main() -> list[int]:
        return await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(200))), 60)

    assert asyncio.run(main()) == [5] * 200


def test_64_mib_upload_and_download_keep_their_sha256(stack: tuple[Kproxy, Path]) -> None:
    """A 64 MiB body each way arrives intact (chunked download, streamed upload)."""
    import json
    kp, _ = stack
    size = 64 * MIB
    payload = random.Random(1).randbytes(size)
    conn = http.client.HTTPConnection(kp.listen, timeout=60)
    conn.request("POST", "/upload", body=payload,
                 headers={"Host": SHOP, "Content-Type": "application/octet-stream"})
    answer = json.loads(conn.getresponse().read())
    assert answer["bytes"] == size and answer["sha256"] == hashlib.sha256(payload).hexdigest()
    conn.request("GET", f"/download?size={size}", headers={"Host": SHOP})
    resp = conn.getresponse()
    digest = hashlib.sha256()
    total = 0
    while chunk := resp.read(MIB):
        digest.update(chunk)
        total += len(chunk)
    conn.close()
    assert total == size
    assert digest.hexdigest() == hashlib.sha256(random.Random(size).randbytes(size)).hexdigest()


def test_websocket_echo_through_the_listener(stack: tuple[Kproxy, Path]) -> None:
    """The Upgrade passes through on a host-less rule and frames flow both ways (websockets library)."""
    import websockets.asyncio.client as ws_client

    kp, _ = stack

    async def main() -> list[str]:
        async with ws_client.connect(f"ws://{kp.listen}/ws") as ws:  # the default server's /ws
            out = []
            for word in ("hello", "kproxy", "x" * 100_000):
                await ws.send(word)
                out.append(str(await asyncio.wait_for(ws.recv(), 5)))
            await ws.send(b"\x00\x01binary")
            out.append(repr(await asyncio.wait_for(ws.recv(), 5)))
            return out

    replies = asyncio.run(main())
    pod = replies[0].split(":")[0]
    assert replies[:2] == [f"{pod}:hello", f"{pod}:kproxy"] and replies[2] == f"{pod}:" + "x" * 100_000
    assert replies[3] == repr(b"\x00\x01binary")
