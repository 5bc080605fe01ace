"""Shared pieces of the port-forward end-to-end tests: pods, manifests, kubectl, byte checks.

The "pods" are small asyncio servers on loopback (or inside a network namespace the test made):
``echo`` returns every byte and passes on half-close; ``digest`` reads until EOF and then answers
the SHA-256 of what it read (so the answer needs the client's half-close to arrive while the
other direction stays open); ``push`` writes N bytes at once and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
CHUNK = 256 * 1024
# (kube minor, KUBECTL_PORT_FORWARD_WEBSOCKETS, transport the server must see)
PATHS = [(33, "true", "websocket"), (33, "false", "spdy"), (29, "true", "spdy")]
PATH_IDS = ["1.33-websocket-tunnel", "1.33-spdy", "1.29-spdy-only"]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        writer.write_eof()
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _digest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    h = hashlib.sha256()
    try:
        while data := await reader.read(CHUNK):
            h.update(data)
        writer.write(h.hexdigest().encode())
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def pusher(size: int) -> Any:
    """A pod that writes ``size`` bytes of a fixed pattern to each connection, then closes."""

    async def push(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sent = 0
            block = pattern(CHUNK)
            while sent < size:
                n = min(CHUNK, size - sent)
                writer.write(block[:n])
                await writer.drain()
                sent += n
            writer.write_eof()
            await reader.read()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    return push


def pattern(size: int) -> bytes:
    """``size`` bytes of a repeating, position-dependent pattern."""
    return bytes(i % 251 for i in range(size))


@dataclass
class Pods:
    """Running pod servers on 127.0.0.1: port numbers by role."""

    echo: int
    digest: int
    push: int
    refused: int


@contextlib.asynccontextmanager
async def loopback_pods(push_size: int = 8 << 20) -> AsyncIterator[Pods]:
    """Echo, digest and push servers on free loopback ports, and a port with nothing listening."""
    servers = [await asyncio.start_server(h, "127.0.0.1", 0, limit=CHUNK)
               for h in (_echo, _digest, pusher(push_size))]
    closed = await asyncio.start_server(_echo, "127.0.0.1", 0)
    refused = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    try:
        ports = [s.sockets[0].getsockname()[1] for s in servers]
        yield Pods(echo=ports[0], digest=ports[1], push=ports[2], refused=refused)
    finally:
        for s in servers:
            s.close()


def pod_manifest(name: str, pods: Pods, *, namespace: str = "demo", ip: str = "127.0.0.1",
                 annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None
                 ) -> dict[str, Any]:
    """A Running Pod with named container ports echo, digest, push and refused."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {"app": "web"}}
    if annotations:
        meta["annotations"] = annotations
    ports = [{"name": n, "containerPort": getattr(pods, n)} for n in ("echo", "digest", "push", "refused")]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "app", "ports": ports}]}, "status": {"podIP": ip}}


def service_manifest(pods: Pods, *, namespace: str = "demo") -> dict[str, Any]:
    """Service web: port 80 -> targetPort 'echo' (named), 81 -> the digest port number."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": namespace},
            "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80, "targetPort": "echo"},
                               {"name": "digest", "port": 81, "targetPort": pods.digest}]}}


def write_manifests(path: Path, objects: list[dict[str, Any]]) -> Path:
    """Write ``objects`` as one ``kind: List`` YAML file, atomically (a rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}), encoding="utf-8")
    os.replace(tmp, path)
    return path


@dataclass
class Kubectl:
    """A running ``kubectl port-forward``: its process, the local ports it prints, its output."""

    proc: asyncio.subprocess.Process
    ports: list[int]
    stdout: list[str]

    async def stderr(self) -> str:
        """Everything kubectl wrote on stderr (waits for it to exit)."""
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode()


def kubectl_env(websockets: str = "true") -> dict[str, str]:
    """The environment for kubectl: no proxies, the tunnel switched on or off."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["KUBECTL_PORT_FORWARD_WEBSOCKETS"] = websockets
    env["HOME"] = env.get("HOME", "/tmp")
    return env


@contextlib.asynccontextmanager
async def kubectl_port_forward(kubeconfig: Path, target: str, *ports: str, websockets: str = "true",
                               namespace: str = "demo") -> AsyncIterator[Kubectl]:
    """Run ``kubectl port-forward`` on 127.0.0.1 until the block ends; waits for its listeners."""
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", str(kubeconfig), "-n", namespace, "port-forward", "--address", "127.0.0.1",
        target, *ports, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=kubectl_env(websockets))
    assert proc.stdout is not None
    got: list[int] = []
    lines: list[str] = []
    try:
        async with asyncio.timeout(30):
            while len(got) < len(ports):
                line = (await proc.stdout.readline()).decode()
                if not line:
                    assert proc.stderr is not None
                    raise AssertionError(f"kubectl exited: {(await proc.stderr.read()).decode()}")
                lines.append(line)
                m = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) ->", line)
                if m:
                    got.append(int(m.group(1)))
        yield Kubectl(proc=proc, ports=got, stdout=lines)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def roundtrip(port: int, payload: bytes, *, timeout_s: float = 60) -> bytes:
    """Send ``payload`` to 127.0.0.1:``port``, half-close, and read until EOF."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=CHUNK)
        try:
            async def send() -> None:
                view = memoryview(payload)
                for i in range(0, len(payload), CHUNK):
                    writer.write(view[i:i + CHUNK])
                    await writer.drain()
                writer.write_eof()

            sender = asyncio.ensure_future(send())
            out = bytearray()
            while data := await reader.read(CHUNK):
                out += data
            await sender
            return bytes(out)
        finally:
            writer.close()
