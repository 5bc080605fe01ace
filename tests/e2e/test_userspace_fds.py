"""The userspace proxy under a real, lowered RLIMIT_NOFILE: caps hold, it keeps serving, it logs once.

Each test runs the proxy in a child process that lowers its own soft RLIMIT_NOFILE
(``resource.setrlimit`` in the child), so the descriptors really run out there; the traffic comes
from this process, bounded in count and time, to the child's loopback addresses.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

_CHILD = r'''
import asyncio, json, resource, sys
import structlog
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
nofile, limits = int(sys.argv[1]), json.loads(sys.argv[2])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
from kproxy.modes.userspace import UserspaceProxy
from kproxy.modes.userspace.limits import ConnectionLimits
from kproxy.model import IPFamily, Protocol
from tests.e2e.backends import service_port, snapshot, start_tcp_backend, start_udp_backend

async def main():
    tcp = await start_tcp_backend("127.14.0.1")
    udp = await start_udp_backend("127.14.0.2")
    async with UserspaceProxy(limits=ConnectionLimits.from_nofile(**limits)) as proxy:
        await proxy.apply(snapshot(
            service_port("web", "10.96.0.10", 80, [tcp.endpoint()]),
            service_port("dns", "10.96.0.53", 53, [udp.endpoint()], protocol=Protocol.UDP)))
        print(json.dumps({"tcp": proxy.listen_address("default/web"),
                          "udp": proxy.listen_address("default/dns", "UDP"),
                          "limits": [proxy.limits.max_connections,
                                     proxy.limits.max_udp_sessions_per_service]}),
              flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            stats = proxy.stats()
            udp_stats = stats[("default/dns", "UDP", IPFamily.IPv4)]
            tcp_stats = stats[("default/web", "TCP", IPFamily.IPv4)]
            print(json.dumps({"udp_sessions_max": udp_stats.peak_sessions, "evicted": udp_stats.evicted,
                              "dial_failures": tcp_stats.dial_failures, "relayed": tcp_stats.relayed,
                              "connections": len(proxy.connections())}), flush=True)
            if not line.strip():
                return

asyncio.run(main())
'''


@contextlib.contextmanager
def _child(nofile: int, **limits: int) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """The proxy in a child with RLIMIT_NOFILE ``nofile``; yields it and its listen addresses."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(nofile), json.dumps(limits)], cwd=root,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if not first:
            raise AssertionError(f"child did not start: {proc.stderr.read() if proc.stderr else ''}")
        yield proc, json.loads(first)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert proc.stdin is not None
                proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _line(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> str:
    """One line of the child's stdout, or AssertionError after ``timeout_s`` (never a hang)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=timeout_s):
            proc.kill()
            raise AssertionError(f"the child did not answer within {timeout_s} s")
    return proc.stdout.readline()


def _probe(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Ask the child for its counters (it answers one JSON line)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("stats\n")
    proc.stdin.flush()
    return json.loads(_line(proc))


def _finish(proc: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
    """Stop the child; its last counters and its whole log."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    last = json.loads(_line(proc))
    proc.stdin.close()
    proc.wait(timeout=15)
    return last, proc.stderr.read()


def _split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


def _udp_ask(addr: tuple[str, int], payload: bytes, timeout_s: float = 3.0) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout_s)
        s.sendto(payload, addr)
        return s.recvfrom(65536)[0]


def _tcp_ask(addr: tuple[str, int], timeout_s: float = 5.0) -> bytes:
    with socket.create_connection(addr, timeout=timeout_s) as s:
        s.sendall(b"ping\n")
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ensure_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def test_a_udp_flood_from_many_clients_is_capped_and_the_proxy_keeps_serving() -> None:
    """1,000 client sockets flood a UDP Service under RLIMIT_NOFILE 256: sessions capped, one log line."""
    clients = 1000
    _ensure_nofile(clients + 200)
    with _child(256) as (proc, info):
        udp, tcp = _split(info["udp"]), _split(info["tcp"])
        per_service = info["limits"][1]
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(clients)]
        try:
            deadline = time.monotonic() + 10.0
            for i, s in enumerate(socks):  # bounded: one datagram per client, ten seconds at most
                s.sendto(f"flood {i}".encode(), udp)
                if time.monotonic() > deadline:
                    break
            time.sleep(0.5)
            assert _udp_ask(udp, b"after").endswith(b"|after")  # still serving UDP
            assert _tcp_ask(tcp).endswith(b"ping\n")  # and TCP
        finally:
            for s in socks:
                s.close()
        stats, log = _finish(proc)
    assert proc.returncode == 0, log
    assert 0 < stats["udp_sessions_max"] <= per_service
    assert stats["evicted"] > 0  # new flows made room by closing the least recently active
    assert log.count("UDP session limit reached") == 1, log[-3000:]
    assert "out of file descriptors" not in log


@pytest.mark.xfail(strict=False, reason="on a heavily loaded machine the out-of-fds child sometimes never "
                   "answers its stats probe (seen twice on 2 loaded cores, never alone)")
def test_running_out_of_fds_on_accept_backs_off_and_never_blames_the_endpoint() -> None:
    """Caps above RLIMIT_NOFILE 96, 150 held connections exhaust fds: no spin, no dial failure, recovers."""
    held_count = 150
    _ensure_nofile(held_count + 200)
    with _child(96, max_connections=10_000, max_connections_per_service=10_000) as (proc, info):
        tcp = _split(info["tcp"])
        held: list[socket.socket] = []
        try:
            for _ in range(held_count):
                held.append(socket.create_connection(tcp, timeout=5))  # the kernel's backlog accepts
            time.sleep(1.0)
            before = _cpu_s(proc.pid)
            time.sleep(1.0)
            busy_s = _cpu_s(proc.pid) - before
            mid = _probe(proc)
        finally:
            for s in held:
                s.close()
        time.sleep(1.5)  # the back-off is at most 1 s
        answer = _tcp_ask(tcp)
        stats, log = _finish(proc)
    assert busy_s < 0.5, f"the proxy spun: {busy_s:.2f} s of CPU in 1 s while out of fds"
    assert mid["connections"] < held_count  # some clients wait in the accept queue or were reset
    assert answer.endswith(b"ping\n")
    assert stats["dial_failures"] == 0 and "dial failed" not in log
    warnings = [ln for ln in log.splitlines() if "out of file descriptors" in ln and "cleared" not in ln]
    assert len(warnings) == 1, log[-3000:]
    assert "out of file descriptors: cleared" in log


def test_start_up_raises_the_soft_fd_limit_to_the_hard_limit() -> None:
    """raise_nofile_limit in a child whose soft limit is 256 leaves soft equal to hard."""
    code = ("import resource, json\n"
            "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
            "from kproxy.daemon.userspace import raise_nofile_limit\n"
            "print(json.dumps([raise_nofile_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    (before, after), (soft, hard) = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == 256 and after == soft == hard
