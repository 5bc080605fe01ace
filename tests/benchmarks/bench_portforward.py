"""Benchmark ``kproxy port-forward`` against ``kubectl port-forward``, same server, same pod.

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_portforward.py [--mib 256] [--seconds 3] [--rounds 2]

One ``kproxy cluster serve`` process serves a Pod on 127.0.0.1 whose ports are a byte sink
(answers the byte count at EOF) and an echo server (a backend process of its own). Each client
under test is a separate process forwarding to that Pod: kubectl over the WebSocket tunnel
(its default since 1.31), kubectl over SPDY, and kproxy over the tunnel and over SPDY. Measured
per client:

* bulk throughput: ``--mib`` MiB into the sink through the forward (MiB/s);
* new connections per second: connect, a 1-byte echo, close, 8 at a time, for ``--seconds``;
* the p50 time of one such connection alone (50 in a row).

Everything shares the machine's cores, so only the ratios mean much; each figure is the best of
``--rounds``, which interleave the clients. The ratios printed are kproxy / kubectl on the
same transport (target >= 1.0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KPROXY = [sys.executable, "-m", "kproxy"]
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"

BACKEND = r"""
import asyncio, sys
class Echo(asyncio.Protocol):
    def connection_made(self, t): self.t = t
    def data_received(self, d): self.t.write(d)
class Sink(asyncio.Protocol):
    def connection_made(self, t): self.t = t; self.n = 0
    def data_received(self, d): self.n += len(d)
    def eof_received(self):
        self.t.write(b"%d\n" % self.n); self.t.close()
async def main():
    loop = asyncio.get_running_loop()
    e = await loop.create_server(Echo, "127.0.0.1", 0)
    s = await loop.create_server(Sink, "127.0.0.1", 0)
    print(e.sockets[0].getsockname()[1], s.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def _line(proc: asyncio.subprocess.Process, pattern: str, timeout_s: float = 60) -> re.Match[str]:
    assert proc.stdout is not None
    async with asyncio.timeout(timeout_s):
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                raise RuntimeError(f"process exited before printing {pattern!r}")
            m = re.search(pattern, raw.decode())
            if m:
                return m


async def _bulk(port: int, mib: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    block = b"\0" * (1 << 20)
    start = time.perf_counter()
    for _ in range(mib):
        writer.write(block)
        await writer.drain()
    writer.write_eof()
    count = int((await reader.readline()).strip() or 0)
    elapsed = time.perf_counter() - start
    writer.close()
    if count != mib << 20:
        raise RuntimeError(f"sink counted {count} bytes, sent {mib << 20}")
    return mib / elapsed


async def _conns(port: int, seconds: float, parallel: int = 8) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"x")
            if await reader.readexactly(1) != b"x":
                raise RuntimeError("echo mismatch")
            writer.close()
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(parallel)))
    return done / (time.perf_counter() - start)


async def _latency(port: int, count: int = 50) -> float:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"x")
        await reader.readexactly(1)
        writer.close()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


async def _client(argv: list[str], env: dict[str, str]) -> tuple[asyncio.subprocess.Process, list[int]]:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.DEVNULL, env=env)
    ports = []
    for _ in range(2):
        m = await _line(proc, r"Forwarding from 127\.0\.0\.1:(\d+) ->")
        ports.append(int(m.group(1)))
    return proc, ports


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="kproxy-bench-pf-"))
    backend = await asyncio.create_subprocess_exec(sys.executable, "-c", BACKEND,
                                                   stdout=asyncio.subprocess.PIPE)
    m = await _line(backend, r"(\d+) (\d+)")
    echo, sink = int(m.group(1)), int(m.group(2))
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bench", "namespace": "default"},
                "spec": {"containers": [{"name": "app"}]}, "status": {"podIP": "127.0.0.1"}}
    (work / "pod.json").write_text(json.dumps(manifest))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PYTHONPATH"] = str(REPO)
    server = await asyncio.create_subprocess_exec(
        *KPROXY, "cluster", "serve", "-f", str(work / "pod.json"), "--write-kubeconfig", str(work / "kc"),
        "--kubernetes-version", "1.33", "--log-level", "warning", stdout=asyncio.subprocess.PIPE, env=env)
    await _line(server, r"serving on")
    kc = str(work / "kc")
    def forward(argv: list[str]) -> list[str]:
        return [*argv, "--kubeconfig", kc, "--address", "127.0.0.1", "pod/bench", f":{sink}", f":{echo}"]

    clients = {
        "kubectl websocket": (forward([KUBECTL, "port-forward"]),
                              {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "true"}),
        "kproxy websocket": (forward([*KPROXY, "port-forward"]), {}),
        "kubectl spdy": (forward([KUBECTL, "port-forward"]), {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"}),
        "kproxy spdy": (forward([*KPROXY, "port-forward", "--no-tunnel"]), {}),
    }
    results: dict[str, list[float]] = {name: [0.0, 0.0, float("inf")] for name in clients}
    procs: dict[str, tuple[asyncio.subprocess.Process, list[int]]] = {}
    try:
        for name, (argv, extra) in clients.items():
            procs[name] = await _client(argv, {**env, **extra})
        # Rounds interleave the clients, so a burst of load elsewhere on the machine hits all.
        for _ in range(args.rounds):
            for name, (_, (sink_port, echo_port)) in procs.items():
                best = results[name]
                best[0] = max(best[0], await _bulk(sink_port, args.mib))
                best[1] = max(best[1], await _conns(echo_port, args.seconds))
                best[2] = min(best[2], await _latency(echo_port))
        for name, (bulk, conns, p50) in results.items():
            print(f"{name:18s} bulk {bulk:8.1f} MiB/s   new connections {conns:8.1f}/s   "
                  f"one connection p50 {p50 * 1e3:6.2f} ms", flush=True)
    finally:
        for proc, _ in procs.values():
            proc.kill()
            await proc.wait()
        for proc in (server, backend):
            proc.kill()
            await proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    for transport in ("websocket", "spdy"):
        k, c = results[f"kproxy {transport}"], results[f"kubectl {transport}"]
        print(f"ratio kproxy/kubectl over {transport}: bulk {k[0] / c[0]:.2f}x, "
              f"new connections {k[1] / c[1]:.2f}x, one-connection speed {c[2] / k[2]:.2f}x "
              "(kubectl's p50 time / kproxy's)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
