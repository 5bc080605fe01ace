"""Benchmark: does serving stall while a large manifest loads? (issue 18 item 5)

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_manifest_load.py [--services 4000] [--seconds 6]

The userspace proxy runs in this process on a folder of manifests holding one Service (``probe``)
whose endpoint is an echo backend in a child process. A prober in another child process opens a
connection to ``probe`` every 10 ms, sends one byte and waits for its echo (connect plus first
byte), and records the latency. Two phases, measured in the same run:

* idle: nothing changes;
* loading: half a second in, a file of ``--services`` Services and their EndpointSlices (about
  3 MB of YAML for 4,000) is copied into the folder, and the proxy parses, validates, tracks
  and programs it while the prober keeps going.

It prints p50/p99/max of each phase and the ratio loading/idle of the p99 (the goal: within 2x).

``--plane userspace`` (default) measures the whole proxy. ``--plane engine`` isolates the source
and the sync engine: the probe then reaches an echo server on the same event loop (standing in
for the data plane) while the engine loads the file into a consumer that only keeps the
Snapshot, so what it shows is the stall the source, tracker and snapshot building cause.
Everything is on loopback; the load is bounded by the phase durations and the prober's 10 ms
pace. Client, proxy and backend share the machine's cores, so only the ratio means much.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from kproxy.daemon import UserspaceOptions, running_userspace_proxy  # noqa: E402
from kproxy.model import NodeConfig, Snapshot  # noqa: E402
from kproxy.sources.manifests import ManifestSource  # noqa: E402
from kproxy.sync import SyncEngine  # noqa: E402

BACKEND = r"""
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(512)
print(srv.getsockname()[1], flush=True)
def serve(c):
    with c:
        while (d := c.recv(4096)):
            c.sendall(d)
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

PROBER = r"""
import json, socket, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
out, end = [], time.monotonic() + seconds
while time.monotonic() < end and len(out) < 100_000:
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(b"x")
            s.recv(1)
        out.append(time.perf_counter() - t0)
    except OSError:
        out.append(5.0)
    time.sleep(max(0.0, 0.01 - (time.perf_counter() - t0)))
print(json.dumps(out))
"""


def _service(name: str, ip: str, endpoint: str, port: int) -> str:
    return (f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n"
            f"spec: {{clusterIP: {ip}, ports: [{{port: 80, targetPort: {port}, protocol: TCP}}]}}\n"
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
            f"metadata: {{name: {name}-abc, namespace: default, "
            f"labels: {{kubernetes.io/service-name: {name}}}}}\n"
            f"addressType: IPv4\nendpoints: [{{addresses: [{endpoint}], conditions: {{ready: true}}}}]\n"
            f"ports: [{{port: {port}, protocol: TCP, name: ''}}]\n")


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(pick(0.5), 2), "p99_ms": round(pick(0.99), 2),
            "max_ms": round(ordered[-1] * 1000, 2)}


async def _probe(host: str, port: int, seconds: float) -> list[float]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", PROBER, host, str(port), str(seconds),
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return list(json.loads(out))


class _Keep:
    """A consumer that keeps the last Snapshot (``--plane engine``)."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None

    async def apply(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot``."""
        self.snapshot = snapshot


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def _engine_plane(folder: Path) -> AsyncIterator[tuple[str, int, Callable[[], int]]]:
    keep = _Keep()
    engine = SyncEngine(ManifestSource([folder], poll_interval_s=0.2), NodeConfig(hostname="bench"), [keep],
                        min_sync_period_s=1.0)
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    async with server, asyncio.TaskGroup() as tg:
        task = tg.create_task(engine.run())
        await engine.wait_synced(1)
        try:
            yield "127.0.0.1", server.sockets[0].getsockname()[1], lambda: len(keep.snapshot or ())
        finally:
            task.cancel()


@contextlib.asynccontextmanager
async def _userspace_plane(folder: Path) -> AsyncIterator[tuple[str, int, Callable[[], int]]]:
    opts = UserspaceOptions(bind_address="127.0.0.1", min_sync_period_s=1.0, sync_period_s=30.0,
                            drain_timeout_s=1.0)
    async with running_userspace_proxy(ManifestSource([folder], poll_interval_s=0.2),
                                       node=NodeConfig(hostname="bench"), options=opts,
                                       startup_timeout_s=30) as running:
        host, port = running.listen_address("default/probe")
        yield host, port, lambda: len(running.engine.snapshot or ())


async def main(services: int, seconds: float, plane: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="kproxy-bench-load-"))
    backend = subprocess.Popen([sys.executable, "-c", BACKEND], stdout=subprocess.PIPE, text=True)
    try:
        assert backend.stdout is not None
        backend_port = int(backend.stdout.readline())
        folder = workdir / "m"
        folder.mkdir()
        (folder / "probe.yaml").write_text(_service("probe", "10.96.255.1", "127.0.0.1", backend_port))
        big = workdir / "big.yaml"
        big.write_text("---\n".join(_service(f"svc-{i}", f"10.96.{i // 250}.{i % 250 + 1}", "127.0.0.1",
                                             backend_port) for i in range(services)))
        print(f"large manifest: {services} Services, {big.stat().st_size / 1e6:.1f} MB")
        serving = _engine_plane(folder) if plane == "engine" else _userspace_plane(folder)
        async with serving as (host, port, served):
            idle = _percentiles(await _probe(host, port, seconds))
            loading_task = _probe(host, port, seconds)

            async def load() -> None:
                await asyncio.sleep(0.5)
                shutil.copy(big, folder / "big.yaml")

            started = time.monotonic()
            latencies, _ = await asyncio.gather(loading_task, load())
            loading = _percentiles(latencies)
            async with asyncio.timeout(120):
                while served() < services + 1:
                    await asyncio.sleep(0.05)
            loaded_s = time.monotonic() - started - 0.5
        print(f"plane: {plane}")
        print(f"idle:    {idle}")
        print(f"loading: {loading}  (all {services + 1} Services served {loaded_s:.1f} s after the copy)")
        print(f"p99 loading/idle: {loading['p99_ms'] / max(idle['p99_ms'], 0.001):.2f}x (goal: <= 2x)")
    finally:
        backend.kill()
        backend.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=4000)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--plane", choices=("userspace", "engine"), default="userspace")
    args = parser.parse_args()
    asyncio.run(main(args.services, args.seconds, args.plane))
