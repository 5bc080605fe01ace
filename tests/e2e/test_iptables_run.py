"""``kproxy run --proxy-mode iptables``: keeps an emulated node, or a real namespace, in sync."""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns, sh
from tests.scenarios import NODE, cluster

_DEADLINE_S = 20.0


def _write(path: Path, docs: list[dict[str, object]]) -> None:
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))


def _start(prefix: list[str], manifests: Path, kernel: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*prefix, sys.executable, "-m", "kproxy", "run", "--manifests", str(manifests),
                             "--proxy-mode", "iptables", "--kernel", kernel, "--hostname-override", NODE,
                             "--ip-families", "IPv4", "--min-sync-period", "0s", "--sync-period", "1s",
                             "--log-level", "debug"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err


def test_run_with_the_emulated_kernel_syncs_and_stops_cleanly(tmp_path: Path) -> None:
    """The emulated kernel is programmed (a debug 'iptables synced' line) and SIGTERM exits 0."""
    manifests = tmp_path / "cluster.json"
    _write(manifests, cluster())
    proc = _start([], manifests, "emulated")
    seen = _read_until(proc, "iptables synced")
    code, err = _stop(proc)
    assert code == 0, seen + err
    assert "iptables synced" in seen


def _read_until(proc: subprocess.Popen[str], wanted: str) -> str:
    """stderr of ``proc`` up to the line holding ``wanted`` (or all there is by the deadline)."""
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + _DEADLINE_S
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline and not any(wanted in line for line in seen):
            if sel.select(timeout=deadline - time.monotonic()):
                line = proc.stderr.readline()
                if not line:
                    break
                seen.append(line)
    return "".join(seen)


@pytest.mark.kernel
def test_run_with_the_linux_kernel_follows_manifest_changes(tmp_path: Path) -> None:
    """In a namespace, the Services' chains appear, and a deleted Service's chains go away."""
    require_kernel("iptables-restore", "iptables-save", "iptables")
    cleanup_stale()
    manifests = tmp_path / "cluster.json"
    docs = cluster()
    _write(manifests, docs)
    with netns("run") as ns:
        proc = _start(["ip", "netns", "exec", ns], manifests, "linux")
        try:
            assert _wait(ns, lambda save: "ns1/svc1:p80 cluster IP" in save and "KUBE-SERVICES" in save)
            _write(manifests, [d for d in docs if d["metadata"]["namespace"] != "ns1"])  # type: ignore[index]
            assert _wait(ns, lambda save: "ns1/svc1" not in save and "ns3/svc3:p80" in save)
        finally:
            code, err = _stop(proc)
        assert code == 0, err


def _wait(ns: str, ok: object) -> bool:
    deadline = time.monotonic() + _DEADLINE_S
    while time.monotonic() < deadline:
        save = sh("ip", "netns", "exec", ns, "iptables-save").stdout
        if ok(save):  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False
