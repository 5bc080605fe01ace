"""Benchmark kproxy's userspace data plane against a direct connection, socat and HAProxy.

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_userspace.py [--seconds 1.5]

Every target relays to the same backend process (a uvloop echo server and a byte sink); the
client runs in this process on uvloop. socat and HAProxy are measured when installed and skipped
otherwise. Measured per target:

* bulk throughput, 1 and 8 streams (client -> sink, Gbit/s);
* new TCP connections per second (connect, 1-byte echo, close; 8 at a time);
* keep-alive request/response per second (64-byte echo on 8 connections);
* p50/p99 latency of a 64-byte request on one connection (microseconds).

Client, relays and backend share the machine's cores, so only the ratios mean much. The run
takes about a minute: ``--rounds`` x 5 x ``--seconds`` plus start-up per target, and each figure
is the best of the rounds (other processes on the machine only ever make a figure worse).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

REPO = Path(__file__).resolve().parents[2]
BACKEND_IP = "127.60.0.1"
CHUNK = memoryview(b"\0" * (1 << 20))
MSG = b"m" * 63 + b"\n"

BACKEND = r"""
import asyncio, sys, uvloop

class Echo(asyncio.Protocol):
    def connection_made(self, t):
        self.t = t
    def data_received(self, d):
        self.t.write(d)

class Sink(asyncio.Protocol):
    def connection_made(self, t):
        self.t = t; self.n = 0
    def data_received(self, d):
        self.n += len(d)
    def eof_received(self):
        self.t.write(b"%d\n" % self.n); self.t.close()

async def main():
    loop = asyncio.get_running_loop()
    e = await loop.create_server(Echo, sys.argv[1], 0, backlog=4096)
    s = await loop.create_server(Sink, sys.argv[1], 0, backlog=4096)
    print(e.sockets[0].getsockname()[1], s.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

uvloop.run(main())
"""

KPROXY = r"""
import asyncio, json, sys, uvloop, structlog, logging
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
from types import MappingProxyType
from kproxy.model import Endpoint, IPFamily, NodeConfig, Protocol, ServicePortInfo, ServicePortName, Snapshot
from kproxy.modes.userspace import UserspaceProxy

def port(name, cip, ep):
    eps = (ep,)
    return ServicePortInfo(name=ServicePortName(namespace="bench", name=name), family=IPFamily.IPv4,
                           cluster_ip=cip, port=80, protocol=Protocol.TCP, target_port=80,
                           endpoints=eps, cluster_endpoints=eps, all_reachable_endpoints=eps,
                           has_any_endpoints=True)

async def main():
    ip, echo, sink = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ports = [port("echo", "10.96.0.1", Endpoint(ip=ip, port=echo)),
             port("sink", "10.96.0.2", Endpoint(ip=ip, port=sink))]
    by_key = MappingProxyType({(p.family, p.name): p for p in ports})
    snap = Snapshot(revision=1, node=NodeConfig(), ports=by_key)
    async with UserspaceProxy(bind_address="127.0.0.1") as proxy:
        await proxy.apply(snap)
        print(json.dumps({e.service: e.listen for e in proxy.address_table()}), flush=True)
        await asyncio.Event().wait()

uvloop.run(main())
"""

HAPROXY_CFG = """
global
    maxconn 4000
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend echo
    bind 127.0.0.1:{echo_front}
    default_backend echo_b
frontend sink
    bind 127.0.0.1:{sink_front}
    default_backend sink_b
backend echo_b
    server s1 {ip}:{echo}
backend sink_b
    server s1 {ip}:{sink}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


# -- client workloads (uvloop, raw non-blocking sockets) ------------------------------------


async def _connect(addr: tuple[str, int]) -> socket.socket:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await loop.sock_connect(sock, addr)
    return sock


async def bulk(addr: tuple[str, int], streams: int, seconds: float) -> float:
    """Gbit/s pushed into the sink through ``addr`` by ``streams`` parallel connections."""
    loop = asyncio.get_running_loop()

    async def one(deadline: float) -> int:
        sock = await _connect(addr)
        try:
            while time.perf_counter() < deadline:
                await loop.sock_sendall(sock, CHUNK)
            sock.shutdown(socket.SHUT_WR)
            reply = b""
            while not reply.endswith(b"\n"):
                data = await loop.sock_recv(sock, 64)
                if not data:
                    break
                reply += data
            return int(reply)
        finally:
            sock.close()

    start = time.perf_counter()
    total = sum(await asyncio.gather(*(one(start + seconds) for _ in range(streams))))
    return total * 8 / (time.perf_counter() - start) / 1e9


async def conn_rate(addr: tuple[str, int], seconds: float, concurrency: int = 8) -> float:
    """New connections per second (connect, 1-byte echo, close)."""
    loop = asyncio.get_running_loop()
    count = 0

    async def worker(deadline: float) -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            sock = await _connect(addr)
            try:
                await loop.sock_sendall(sock, b"x")
                if await loop.sock_recv(sock, 1) == b"x":
                    count += 1
            finally:
                sock.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker(start + seconds) for _ in range(concurrency)))
    return count / (time.perf_counter() - start)


async def _rr(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    await loop.sock_sendall(sock, MSG)
    got = 0
    while got < len(MSG):
        data = await loop.sock_recv(sock, 4096)
        if not data:
            raise ConnectionError("echo closed")
        got += len(data)


async def rr_rate(addr: tuple[str, int], seconds: float, connections: int = 8) -> float:
    """64-byte request/response exchanges per second over ``connections`` keep-alive connections."""
    loop = asyncio.get_running_loop()
    count = 0

    async def worker(deadline: float) -> None:
        nonlocal count
        sock = await _connect(addr)
        try:
            while time.perf_counter() < deadline:
                await _rr(loop, sock)
                count += 1
        finally:
            sock.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker(start + seconds) for _ in range(connections)))
    return count / (time.perf_counter() - start)


async def latency(addr: tuple[str, int], seconds: float) -> tuple[float, float]:
    """(p50, p99) in microseconds of one 64-byte request/response on one connection."""
    loop = asyncio.get_running_loop()
    sock = await _connect(addr)
    samples: list[int] = []
    try:
        for _ in range(200):  # warm-up
            await _rr(loop, sock)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline and len(samples) < 50_000:
            t0 = time.perf_counter_ns()
            await _rr(loop, sock)
            samples.append(time.perf_counter_ns() - t0)
    finally:
        sock.close()
    samples.sort()
    return samples[len(samples) // 2] / 1e3, samples[int(len(samples) * 0.99)] / 1e3


# -- targets --------------------------------------------------------------------------------


class Target:
    """A relay under test: its echo and sink addresses, and how to stop it."""

    def __init__(
        self,
        name: str,
        echo: tuple[str, int],
        sink: tuple[str, int],
        procs: list[subprocess.Popen[bytes]] | None = None,
    ) -> None:
        self.name = name
        self.echo = echo
        self.sink = sink
        self.procs = procs or []

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start_kproxy(echo: int, sink: int) -> Target:
    proc = subprocess.Popen(
        [sys.executable, "-c", KPROXY, BACKEND_IP, str(echo), str(sink)], stdout=subprocess.PIPE, cwd=REPO
    )
    assert proc.stdout is not None
    table = json.loads(proc.stdout.readline())
    e_host, _, e_port = table["bench/echo"].rpartition(":")
    s_host, _, s_port = table["bench/sink"].rpartition(":")
    return Target("kproxy", (e_host, int(e_port)), (s_host, int(s_port)), [proc])


def start_socat(echo: int, sink: int) -> Target | None:
    if shutil.which("socat") is None:
        return None
    fronts = [_free_port(), _free_port()]
    procs = [
        subprocess.Popen(
            [
                "socat",
                "-b",
                "65536",
                f"TCP-LISTEN:{front},bind=127.0.0.1,fork,reuseaddr,backlog=4096",
                f"TCP:{BACKEND_IP}:{port},nodelay",
            ]
        )
        for front, port in zip(fronts, (echo, sink), strict=True)
    ]
    for f in fronts:
        _wait_listening(f)
    return Target("socat", ("127.0.0.1", fronts[0]), ("127.0.0.1", fronts[1]), procs)


def start_haproxy(echo: int, sink: int, workdir: Path) -> Target | None:
    if shutil.which("haproxy") is None:
        return None
    ef, sf = _free_port(), _free_port()
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(HAPROXY_CFG.format(echo_front=ef, sink_front=sf, ip=BACKEND_IP, echo=echo, sink=sink))
    proc = subprocess.Popen(["haproxy", "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL)
    try:
        _wait_listening(ef)
        _wait_listening(sf)
    except RuntimeError:
        proc.kill()
        proc.wait()
        raise
    return Target("haproxy", ("127.0.0.1", ef), ("127.0.0.1", sf), [proc])


# -- the run --------------------------------------------------------------------------------

METRICS: list[tuple[str, str, bool]] = [  # key, unit, higher is better
    ("bulk_1", "Gbit/s", True),
    ("bulk_8", "Gbit/s", True),
    ("conn_per_s", "conn/s", True),
    ("rr_per_s", "req/s", True),
    ("p50_us", "us", False),
    ("p99_us", "us", False),
]


async def measure(target: Target, seconds: float) -> dict[str, float]:
    """Every metric for one target."""
    out: dict[str, float] = {}
    steps: list[tuple[str, Callable[[], Awaitable[float]]]] = [
        ("bulk_1", lambda: bulk(target.sink, 1, seconds)),
        ("bulk_8", lambda: bulk(target.sink, 8, seconds)),
        ("conn_per_s", lambda: conn_rate(target.echo, seconds)),
        ("rr_per_s", lambda: rr_rate(target.echo, seconds)),
    ]
    for key, step in steps:
        out[key] = await step()
        print(f"  {target.name:8} {key:11} {out[key]:12.2f}", flush=True)
    out["p50_us"], out["p99_us"] = await latency(target.echo, seconds)
    print(f"  {target.name:8} {'p50/p99 us':11} {out['p50_us']:12.1f} {out['p99_us']:10.1f}", flush=True)
    return out


def report(results: dict[str, dict[str, float]]) -> None:
    """Print the table of figures and the ratios to direct and to HAProxy."""
    names = list(results)
    print("\n" + f"{'metric':12}" + "".join(f"{n:>12}" for n in names))
    for key, unit, _ in METRICS:
        print(f"{key:12}" + "".join(f"{results[n][key]:12.2f}" for n in names) + f"  {unit}")
    for base in ("direct", "haproxy"):
        if base not in results:
            continue
        print(f"\nratio to {base} (value / {base}; >1 means more, for latency more is worse)")
        print(f"{'metric':12}" + "".join(f"{n:>12}" for n in names if n != base))
        for key, _, _ in METRICS:
            row = "".join(f"{results[n][key] / results[base][key]:12.2f}" for n in names if n != base)
            print(f"{key:12}{row}")


def _best(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Per metric, the best of the rounds (noise from other processes only ever makes things worse)."""
    return {key: (max if higher else min)(r[key] for r in rounds) for key, _, higher in METRICS}


async def run(seconds: float, only: list[str] | None, rounds: int) -> None:
    backend = subprocess.Popen([sys.executable, "-c", BACKEND, BACKEND_IP], stdout=subprocess.PIPE)
    assert backend.stdout is not None
    echo, sink = map(int, backend.stdout.readline().split())
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        starters: list[tuple[str, Callable[[], Target | None]]] = [
            ("direct", lambda: Target("direct", (BACKEND_IP, echo), (BACKEND_IP, sink))),
            ("kproxy", lambda: start_kproxy(echo, sink)),
            ("socat", lambda: start_socat(echo, sink)),
            ("haproxy", lambda: start_haproxy(echo, sink, Path(tmp))),
        ]
        try:
            for name, start in starters:
                if only and name not in only:
                    continue
                try:
                    target = start()
                except (OSError, RuntimeError) as exc:
                    print(f"  {name}: failed to start ({exc}), skipped", flush=True)
                    continue
                if target is None:
                    print(f"  {name}: not installed, skipped", flush=True)
                    continue
                try:
                    results[name] = _best([await measure(target, seconds) for _ in range(rounds)])
                finally:
                    target.stop()
        finally:
            backend.terminate()
            backend.wait()
    report(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="duration of each measurement")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per target; the best is kept")
    parser.add_argument("--only", nargs="*", help="targets to run (direct kproxy socat haproxy)")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(REPO))
    started = time.monotonic()
    uvloop.run(run(args.seconds, args.only, args.rounds))
    print(f"\ntotal run time {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
