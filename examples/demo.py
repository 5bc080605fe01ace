"""The main job: run kproxy's userspace mode on the example cluster and show traffic flowing.

Starts the example pods (``examples/backends.py``), runs ``kproxy run`` on
``examples/cluster.yaml`` as node ``node-a``, then, through every Service kproxy serves, sends
TCP and UDP requests and prints which pod answered each; it checks that round robin spreads,
that terminating and remote-only-by-policy pods get nothing, and that ClientIP affinity holds.
Exits 0 when everything behaved as kube-proxy would, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLUSTER = HERE / "cluster.yaml"
TIMEOUT_S = 5.0


def _wait_for_line(proc: subprocess.Popen[str], prefix: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        if not line and proc.poll() is not None:
            break
    raise SystemExit(f"demo: {prefix!r} never appeared (process exited with {proc.poll()})")


def _wait_for_map(path: Path, expected: int, timeout_s: float) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            table = json.loads(path.read_text())
            if len(table) >= expected:
                return list(table)
        time.sleep(0.05)
    raise SystemExit(f"demo: kproxy did not write {expected} entries to {path} in {timeout_s} s")


def _split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def tcp_request(listen: str, text: str, source_ip: str = "127.0.0.1") -> str:
    """Send one line over a new TCP connection to ``listen`` and return the answer line."""
    family = socket.AF_INET6 if ":" in _split(listen)[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT_S)
        if family == socket.AF_INET:
            sock.bind((source_ip, 0))
        sock.connect(_split(listen))
        sock.sendall(text.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.decode().strip()


def udp_request(listen: str, text: str) -> str:
    """Send one datagram to ``listen`` and return the answer."""
    host, port = _split(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.sendto(text.encode(), (host, port))
        data, peer = sock.recvfrom(65535)
        if (peer[0], peer[1]) != (host, port):
            raise SystemExit(f"demo: the UDP answer came from {peer}, not from {listen}")
    return data.decode().strip()


def main() -> int:
    """Run the demo; return the exit status."""
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kproxy-demo-") as tmp:
        address_map = Path(tmp) / "addresses.json"
        backends = subprocess.Popen(
            [sys.executable, str(HERE / "backends.py"), str(CLUSTER), "--exit-with-parent"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        proxy = None
        try:
            print("demo: starting the example pods ...", _wait_for_line(backends, "ready", 10).strip())
            cmd = ["kproxy", "run", "--manifests", str(CLUSTER), "--proxy-mode", "userspace",
                   "--hostname-override", "node-a", "--address-map", str(address_map),
                   "--min-sync-period", "0s"]
            print("demo: $", " ".join(cmd))
            kproxy = os.environ.get("KPROXY", str(Path(sys.executable).parent / "kproxy"))
            log_path = Path(tmp) / "kproxy.log"
            log_file = log_path.open("w")
            proxy = subprocess.Popen([kproxy, *cmd[1:]], stderr=log_file, text=True)
            table = _wait_for_map(address_map, 5, 15)
            print("\nkproxy's address table (what each Service port listens on):")
            for row in table:
                print(f"  {row['service']:<30} {row['protocol']:<4} cluster {row['cluster_ip']}:"
                      f"{row['port']:<6} -> listen {row['listen']}")
            by_name = {(str(r["service"]), str(r["protocol"])): str(r["listen"]) for r in table}
            failures += _exercise(by_name)
        finally:
            if proxy is not None:
                proxy.send_signal(signal.SIGTERM)
                try:
                    proxy.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proxy.kill()
                    proxy.wait()
                log_file.close()
                err = log_path.read_text()
                print("\nkproxy's log (stderr, shortened):")
                for line in err.splitlines():
                    print("  " + (line if len(line) <= 150 else line[:147] + "..."))
                if proxy.returncode != 0:
                    failures.append(f"kproxy exited with {proxy.returncode}")
                else:
                    print("\ndemo: kproxy stopped cleanly on SIGTERM")
            backends.send_signal(signal.SIGTERM)
            backends.wait(timeout=10)
    if failures:
        print("\nFAILED:\n- " + "\n- ".join(failures))
        return 1
    print("\nOK: every Service answered as kube-proxy would route it.")
    return 0


def _exercise(listen: dict[tuple[str, str], str]) -> list[str]:
    failures = []

    def show(title: str, answers: list[str]) -> Counter[str]:
        pods = Counter(a.split()[0] for a in answers)
        print(f"\n{title}")
        for i, answer in enumerate(answers, 1):
            print(f"  request {i}: answered by {answer.split()[0]}")
        return pods

    web = show("demo/web:http over TCP (round robin; 127.0.10.4 is terminating, so unused):",
               [tcp_request(listen[("demo/web:http", "TCP")], f"GET /{i}") for i in range(6)])
    if set(web) != {"127.0.10.1:8080", "127.0.10.2:8080", "127.0.10.3:8080"}:
        failures.append(f"demo/web: expected the three ready pods, got {dict(web)}")
    dns_udp = show("kube-system/kube-dns:dns over UDP:",
                   [udp_request(listen[("kube-system/kube-dns:dns", "UDP")], f"query {i}")
                    for i in range(4)])
    dns_tcp = show("kube-system/kube-dns:dns-tcp over TCP:",
                   [tcp_request(listen[("kube-system/kube-dns:dns-tcp", "TCP")], f"query {i}")
                    for i in range(4)])
    for name, got in (("dns (UDP)", dns_udp), ("dns-tcp", dns_tcp)):
        if set(got) != {"127.0.12.1:5353", "127.0.12.2:5353"}:
            failures.append(f"kube-dns {name}: expected both pods, got {dict(got)}")
    cache = show("demo/cache (internalTrafficPolicy: Local; only node-a's pod):",
                 [tcp_request(listen[("demo/cache", "TCP")], f"PING {i}") for i in range(4)])
    if set(cache) != {"127.0.13.1:6379"}:
        failures.append(f"demo/cache: expected only node-a's pod, got {dict(cache)}")
    for client in ("127.0.0.100", "127.0.0.101"):
        api = show(f"demo/api:grpc (sessionAffinity: ClientIP) from client {client}:",
                   [tcp_request(listen[("demo/api:grpc", "TCP")], f"call {i}", source_ip=client)
                    for i in range(5)])
        if len(api) != 1:
            failures.append(f"demo/api: affinity broken for {client}: {dict(api)}")
    return failures


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # run the finally blocks: stop kproxy and the pods


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_signal)
    raise SystemExit(main())
