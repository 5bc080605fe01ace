"""The harness API server as clients see it: kproxy's kube source (kubernetes-asyncio), raw
watches (bookmarks, 410, selector transitions), live reload, and the `kproxy cluster serve` and
`kproxy port-forward` commands with real kubectl."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kproxy.cluster import ClusterServer
from kproxy.model import LABEL_SERVICE_PROXY_NAME
from kproxy.sources import EventType
from tests.e2e.portforward_support import (
    KUBECTL,
    kubectl_env,
    loopback_pods,
    pod_manifest,
    roundtrip,
    service_manifest,
    write_manifests,
)
from tests.fakeapi import endpoint_slice, service
from tests.fakeapi.harness import running_source


async def _watch_lines(url: str, count: int, timeout_s: float = 10) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        async with asyncio.timeout(timeout_s):
            async for line in resp.content:
                out.append(json.loads(line))
                if len(out) >= count:
                    break
    return out


async def test_kube_source_lists_and_watches_the_harness_server() -> None:
    """kproxy's kube source syncs from the server (selectors applied) and follows its changes."""
    async with ClusterServer() as api:
        api.apply(service("web", "10.96.0.10"), endpoint_slice("web", ["10.0.0.1"], 8080))
        api.apply(service("other", "10.96.0.11", labels={LABEL_SERVICE_PROXY_NAME: "cilium"}))
        async with running_source(api) as (_, rec):  # type: ignore[arg-type]
            assert sorted(str(e.key) for e in rec.events) == [
                "EndpointSlice default/web-abc", "Service default/web"]
            api.apply(service("db", "10.96.0.20"))
            api.apply(service("db", "10.96.0.20", ports=(5432,)))
            api.delete("Service", "default", "db")
            await rec.wait_for(lambda: rec.seen(EventType.DELETED, "db"))
            assert [e.type for e in rec.events if e.obj.name == "db"] == [
                EventType.ADDED, EventType.UPDATED, EventType.DELETED]
            api.compact()
            api.drop_watches()
            api.apply(service("late", "10.96.0.30"))
            await rec.wait_for(lambda: rec.seen(EventType.ADDED, "late"), timeout_s=10)


async def test_watch_sends_bookmarks_and_selector_transitions() -> None:
    """A watch gets BOOKMARKs when asked, and an object leaving its selector as DELETED."""
    async with ClusterServer(bookmark_interval_s=0.1) as api:
        api.apply(service("web", "10.96.0.10", labels={"team": "a"}))
        rv = api.store.rv
        url = (f"{api.url}/api/v1/services?watch=true&allowWatchBookmarks=true&resourceVersion={rv}"
               "&labelSelector=team%3Da&timeoutSeconds=5")
        reader = asyncio.ensure_future(_watch_lines(url, 3))
        await asyncio.sleep(0.3)
        api.apply(service("web", "10.96.0.10", labels={"team": "b"}))
        events = await reader
    kinds = [e["type"] for e in events]
    assert "BOOKMARK" in kinds and "DELETED" in kinds
    deleted = next(e for e in events if e["type"] == "DELETED")
    assert deleted["object"]["metadata"]["name"] == "web" and deleted["object"]["kind"] == "Service"


async def test_watch_from_a_compacted_version_gets_410_expired() -> None:
    """A watch from a version older than the history is an ERROR event with a 410 Expired Status."""
    async with ClusterServer() as api:
        api.apply(service("web", "10.96.0.10"))
        old = api.store.rv
        api.apply(service("web", "10.96.0.10", ports=(81,)))
        api.compact()
        (event,) = await _watch_lines(f"{api.url}/api/v1/services?watch=true&resourceVersion={old - 1}", 1)
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"


async def test_manifest_edits_are_served_live(tmp_path: Path) -> None:
    """Editing the manifests turns into watch events, without a restart."""
    manifests = write_manifests(tmp_path / "cluster.yaml", [service("web", "10.96.0.10")])
    async with ClusterServer([manifests], reload_interval_s=0.05) as api:
        rv = api.store.rv
        reader = asyncio.ensure_future(_watch_lines(
            f"{api.url}/api/v1/namespaces/default/services?watch=true&resourceVersion={rv}", 2))
        await asyncio.sleep(0.1)
        write_manifests(manifests, [service("web", "10.96.0.10", ports=(8080,)), service("db", "10.96.0.20")])
        events = await reader
    assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in events) == [
        ("ADDED", "db"), ("MODIFIED", "web")]


async def _line(stream: asyncio.StreamReader, needle: str, timeout_s: float = 60) -> str:
    async with asyncio.timeout(timeout_s):
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError(f"stream ended before {needle!r}")
            if needle in line:
                return line


@pytest.mark.skipif(not os.path.exists(KUBECTL), reason="needs kubectl")
async def test_commands_serve_kubectl_and_forward_until_the_pod_leaves_the_manifests(tmp_path: Path) -> None:
    """`kproxy cluster serve` serves kubectl; `kproxy port-forward svc/web :80` prints its free port,
    forwards, and exits 1 with kubectl's message when the pod is removed from the manifests."""
    async with loopback_pods() as pods:
        objects = [pod_manifest("web-0", pods), service_manifest(pods)]
        manifests = write_manifests(tmp_path / "m.yaml", objects)
        kubeconfig = tmp_path / "kubeconfig"
        serve = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kproxy", "cluster", "serve", "-f", str(manifests), "--write-kubeconfig",
            str(kubeconfig), "--kubernetes-version", "1.31", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
        forward = None
        try:
            assert serve.stdout is not None
            assert (await _line(serve.stdout, "serving on")).startswith("serving on http://127.0.0.1:")
            got = await asyncio.create_subprocess_exec(
                KUBECTL, "--kubeconfig", str(kubeconfig), "get", "pods", "-n", "demo",
                stdout=asyncio.subprocess.PIPE, env=kubectl_env())
            out, _ = await asyncio.wait_for(got.communicate(), 60)
            assert "web-0" in out.decode() and "Running" in out.decode()
            forward = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kproxy", "port-forward", "--kubeconfig", str(kubeconfig), "-n", "demo",
                "--address", "127.0.0.1", "svc/web", ":80", stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            assert forward.stdout is not None and forward.stderr is not None
            line = await _line(forward.stdout, "Forwarding from")
            local = int(line.split("127.0.0.1:")[1].split()[0])
            assert local != 80 and line.strip().endswith(f"-> {pods.echo}")
            assert await roundtrip(local, b"through the command") == b"through the command"
            write_manifests(manifests, [service_manifest(pods)])
            assert await asyncio.wait_for(forward.wait(), 30) == 1
            assert "error: lost connection to pod" in (await forward.stderr.read()).decode()
        finally:
            for proc in (forward, serve):
                if proc is not None and proc.returncode is None:
                    proc.kill()
                    await proc.wait()
