"""A real browser through the Ingress listener: headless Chromium, driven over the DevTools protocol."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.l7 import (
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
HOST = "browser.example.com"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")


def _docs(pods: Pods, keep: dict[str, str]) -> list[dict[str, Any]]:
    return [*service_docs("site", "10.96.63.10", keep, pods.port),
            ingress_doc("site", [rule(HOST, ("/", "Prefix", "site", 80))], annotations={
                A + "affinity": "cookie", A + "session-cookie-name": "sticky",
                A + "session-cookie-max-age": "600", A + "session-cookie-samesite": "Strict",
                A + "session-cookie-path": "/"})]


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page's WebSocket."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait (bounded) for its result, skipping events."""
        ident = next(self._ids)
        await self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = json.loads(await asyncio.wait_for(self._ws.recv(), 15))
            if msg.get("id") == ident:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    async def wait_event(self, name: str) -> None:
        """Wait (bounded) for an event."""
        while True:
            msg = json.loads(await asyncio.wait_for(self._ws.recv(), 15))
            if msg.get("method") == name:
                return

    async def load(self, url: str) -> str:
        """Navigate (a reload when ``url`` is the current page) and return the pod the page names."""
        await self.call("Page.navigate", url=url)
        await self.wait_event("Page.loadEventFired")
        result = await self.call("Runtime.evaluate", expression="document.getElementById('pod').textContent",
                                 returnByValue=True)
        return str(result["result"]["value"])


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[str]:
    """Headless Chromium resolving *.example.com to loopback; yields its first page's DevTools URL."""
    assert CHROMIUM is not None
    profile = tmp_path / "profile"
    proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}",
                             "--host-resolver-rules=MAP *.example.com 127.0.0.1", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        wait_until(port_file.exists, timeout_s=30)
        port = int(wait_until(lambda: port_file.read_text().split("\n")[0].strip(), timeout_s=10))
        deadline = time.monotonic() + 20
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as resp:
                pages = [p for p in json.loads(resp.read()) if p.get("type") == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        yield str(pages[0]["webSocketDebuggerUrl"])
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_browser_stays_on_one_pod_moves_when_it_goes_and_sees_the_cookie_attributes(
        chromium: str, tmp_path: Path) -> None:
    """20 reloads on one pod; after it goes, one move and then 20 reloads on the new pod; the cookie
    store holds the asked Max-Age, Path, HttpOnly and SameSite."""
    import websockets.asyncio.client as ws_client

    with http_pods(3, "127.0.63.1") as pods:
        manifests = tmp_path / "site.yaml"
        write_manifests(manifests, _docs(pods, pods.ips))
        with kproxy_run(manifests, tmp_path) as kp:
            wait_until(lambda: get(kp.url("/"), headers={"Host": HOST})[0] == 200)
            url = f"http://{HOST}:{kp.listen.rsplit(':', 1)[1]}/page"

            async def main() -> tuple[list[str], list[str], list[dict[str, Any]]]:
                async with ws_client.connect(chromium, max_size=None) as ws:
                    dt = DevTools(ws)
                    await dt.call("Page.enable")
                    await dt.call("Network.enable")
                    before = [await dt.load(url) for _ in range(21)]
                    cookies = (await dt.call("Network.getCookies", urls=[url]))["cookies"]
                    pinned = before[0]
                    keep = {k: v for k, v in pods.ips.items() if k != pinned}
                    write_manifests(manifests, _docs(pods, keep))
                    deadline = time.monotonic() + 15
                    while (await dt.load(url)) == pinned:
                        assert time.monotonic() < deadline, "the browser never left the removed pod"
                        await asyncio.sleep(0.1)
                    after = [await dt.load(url) for _ in range(20)]
                    return before, after, cookies

            before, after, cookies = asyncio.run(main())
    assert len(set(before)) == 1
    assert len(set(after)) == 1 and after[0] != before[0]
    (sticky,) = [c for c in cookies if c["name"] == "sticky"]
    assert sticky["httpOnly"] is True and sticky["path"] == "/" and sticky["sameSite"] == "Strict"
    assert sticky["secure"] is False and sticky["session"] is False
    assert 500 < sticky["expires"] - time.time() <= 600
    assert sticky["value"].count("|") == 1
