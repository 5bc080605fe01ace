"""Benchmark the Ingress listener against nginx as a reverse proxy and against the backends directly.

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_http.py [--seconds 5] [--connections 32]

The backends are two nginx servers answering ``200 pod-N`` from memory (so the backend is not
the bottleneck); the three targets, measured in the same run with ``wrk`` (keep-alive,
``--connections`` connections, one thread):

* direct: wrk to one backend;
* nginx: Debian's nginx-light as a reverse proxy with ``keepalive 32`` to the backends;
* kproxy: ``kproxy run --ingress-bind-address`` with ``affinity: cookie`` (balanced), every
  request carrying a cookie (so each goes through ``balance()`` and the chash ring).

It prints requests/s and p50/p99 latency per target and the ratios kproxy/nginx and
kproxy/direct. wrk, the proxies and the backends share the machine's cores, so only the ratios
mean much. Needs ``wrk`` and ``nginx`` on PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.e2e.l7 import (  # noqa: E402
    free_port,
    get,
    ingress_doc,
    kproxy_run,
    rule,
    service_docs,
    wait_until,
    write_manifests,
)

BACKENDS = {"pod-0": "127.0.65.1", "pod-1": "127.0.65.2"}
HOST = "bench.example.com"


def _nginx_conf(prefix: Path, body: str) -> Path:
    conf = prefix / "nginx.conf"
    conf.write_text(f"""worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body; proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fcgi; uwsgi_temp_path {prefix}/uwsgi; scgi_temp_path {prefix}/scgi;
{body}
}}
""")
    return conf


@contextlib.contextmanager
def nginx(prefix: Path, body: str) -> Iterator[None]:
    """Run nginx in the foreground with ``body`` as its http block."""
    prefix.mkdir(parents=True, exist_ok=True)
    conf = _nginx_conf(prefix, body)
    proc = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(prefix), "-g", "daemon off;"],
                            stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def wrk(url: str, seconds: float, connections: int, headers: dict[str, str]) -> tuple[float, str, str]:
    """``(requests/s, p50, p99)`` of one wrk run."""
    args = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency"]
    for k, v in headers.items():
        args += ["-H", f"{k}: {v}"]
    out = subprocess.run([*args, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    dist = out.split("Latency Distribution", 1)[1]
    p50 = re.search(r"50%\s+(\S+)", dist).group(1)  # type: ignore[union-attr]
    p99 = re.search(r"99%\s+(\S+)", dist).group(1)  # type: ignore[union-attr]
    return rps, p50, p99


def main() -> int:
    """Run the three targets and print the ratios."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    if not (shutil.which("wrk") and shutil.which("nginx")):
        print("needs wrk and nginx (apt-get install wrk nginx-light)")
        return 1
    port = free_port()
    servers = "\n".join(f"    server {{ listen {ip}:{port}; location / {{ return 200 \"{pod}\"; }} }}"
                        for pod, ip in BACKENDS.items())
    members = " ".join(f"server {ip}:{port};" for ip in BACKENDS.values())
    upstream = f"    upstream pods {{ {members} keepalive 32; }}"
    nport = free_port()
    proxy = (f"{upstream}\n    server {{ listen 127.0.0.1:{nport}; location / {{ proxy_pass http://pods; "
             "proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $host; "
             "proxy_set_header X-Real-IP $remote_addr; proxy_set_header X-Forwarded-For $remote_addr; } }")
    results: dict[str, tuple[float, str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        with nginx(tmp / "backends", servers):
            results["direct"] = wrk(f"http://{BACKENDS['pod-0']}:{port}/", args.seconds, args.connections, {})
            with nginx(tmp / "proxy", proxy):
                results["nginx"] = wrk(f"http://127.0.0.1:{nport}/", args.seconds, args.connections,
                                       {"Host": HOST})
            manifests = tmp / "bench.yaml"
            write_manifests(manifests, [
                *service_docs("bench", "10.96.65.10", BACKENDS, port),
                ingress_doc("bench", [rule(HOST, ("/", "Prefix", "bench", 80))],
                            annotations={"nginx.ingress.kubernetes.io/affinity": "cookie"})])
            with kproxy_run(manifests, tmp, "--log-level", "warning") as kp:
                wait_until(lambda: get(kp.url("/"), headers={"Host": HOST})[0] == 200)
                cookie = get(kp.url("/"), headers={"Host": HOST})[1]["Set-Cookie"].split(";")[0]
                results["kproxy"] = wrk(kp.url("/"), args.seconds, args.connections,
                                        {"Host": HOST, "Cookie": cookie})
    for name, (rps, p50, p99) in results.items():
        print(f"{name:7s} {rps:10.0f} req/s  p50 {p50:>8s}  p99 {p99:>8s}")
    print(f"kproxy/nginx  {results['kproxy'][0] / results['nginx'][0]:.2f}x  (target >= 0.5x)")
    print(f"kproxy/direct {results['kproxy'][0] / results['direct'][0]:.2f}x")
    print(f"nginx/direct  {results['nginx'][0] / results['direct'][0]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
