"""Benchmark how long ``kproxy run --proxy-mode userspace`` takes to exit on SIGTERM.

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_userspace_shutdown.py [--services 200] [--rounds 3]

A real ``kproxy run`` serves ``--services`` Services (two endpoints each) from a generated
manifest; once it has synced it gets SIGTERM with no connection open. Measured: SIGTERM to the
"stopped" log line, and "stopped" to process exit, with the garbage-collector freeze at exit
(what ``serve`` does) and without it (``gc.freeze`` replaced by a no-op, the behaviour before).
The baseline, measured in the same run, is an interpreter that imports ``kproxy.cli.main`` and
exits; the report gives each figure as a ratio of it. Each figure is the best of the rounds.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
_WRAPPER = """
import gc, os, sys
if os.environ.get("KPROXY_BENCH_NO_FREEZE"):
    gc.freeze = lambda: None
from kproxy.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def write_manifest(folder: Path, services: int) -> None:
    """``services`` Services with an EndpointSlice of two loopback endpoints each."""
    docs = []
    for i in range(services):
        docs.append({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": f"s{i}", "namespace": "load"},
                     "spec": {"clusterIP": f"10.96.{i // 250 + 1}.{i % 250 + 1}",
                              "ports": [{"port": 8080, "name": "http"}]}})
        docs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": f"s{i}-a", "namespace": "load",
                                  "labels": {"kubernetes.io/service-name": f"s{i}"}},
                     "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                     "endpoints": [{"addresses": [f"127.1.{i % 250}.{n}"], "conditions": {"ready": True}}
                                   for n in (1, 2)]})
    (folder / "services.yaml").write_text(yaml.safe_dump_all(docs))


def shutdown_once(manifests: Path, freeze: bool, timeout_s: float = 120.0) -> tuple[float, float]:
    """One run: ``(SIGTERM -> "stopped", "stopped" -> exit)`` in seconds."""
    env = None if freeze else {**os.environ, "KPROXY_BENCH_NO_FREEZE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, "run", "--manifests", str(manifests),
                             "--hostname-override", "node-a"],
                            cwd=REPO, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    try:
        for line in proc.stderr:
            if "] synced" in line or time.monotonic() > deadline:
                break
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stopped = None
        for line in proc.stderr:
            if "] stopped" in line:
                stopped = time.monotonic()
                break
        proc.stderr.read()
        proc.wait(timeout=30)
        exited = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if stopped is None:
        raise RuntimeError("kproxy run never logged 'stopped'")
    return stopped - sent, exited - stopped


def baseline_once() -> float:
    """An interpreter importing kproxy.cli.main, from its last output line to its exit, in seconds."""
    code = "import kproxy.cli.main, kproxy.daemon; print('ready', flush=True)"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    ready = time.monotonic()
    proc.wait(timeout=60)
    return time.monotonic() - ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_manifest(folder, args.services)
        base = min(baseline_once() for _ in range(args.rounds))
        frozen = [shutdown_once(folder, True) for _ in range(args.rounds)]
        unfrozen = [shutdown_once(folder, False) for _ in range(args.rounds)]
    print(f"baseline (import kproxy, exit): {base * 1000:.0f} ms")
    for label, runs in (("with gc.freeze at exit", frozen), ("without (before)", unfrozen)):
        to_stopped = min(r[0] for r in runs)
        to_exit = min(r[1] for r in runs)
        print(f"{label:24} SIGTERM->stopped {to_stopped * 1000:6.0f} ms"
              f"   stopped->exit {to_exit * 1000:6.0f} ms  ({to_exit / base:.1f}x baseline)")


if __name__ == "__main__":
    main()
