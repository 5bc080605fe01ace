"""Logging never stops kproxy, even when its log pipe goes away."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import structlog

from kproxy.observability import configure_logging


class _Broken(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_log_call_survives_a_broken_stream() -> None:
    """A log call on a stream whose reader left does not raise."""
    configure_logging("json", stream=_Broken())
    structlog.get_logger("kproxy").info("still here", n=1)
    structlog.get_logger("kproxy").error("and here")


def test_run_keeps_serving_after_its_log_pipe_closes(tmp_path: Path) -> None:
    """`kproxy run` whose stderr reader goes away keeps running and exits 0 on SIGTERM."""
    kproxy = str(Path(sys.executable).parent / "kproxy")
    address_map = tmp_path / "map.json"
    proc = subprocess.Popen([kproxy, "run", "--manifests", "examples/cluster.yaml",
                             "--address-map", str(address_map), "--min-sync-period", "0s",
                             "--healthz-bind-address", "", "--metrics-bind-address", ""],
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    proc.stderr.readline()
    proc.stderr.close()
    deadline = time.monotonic() + 10
    while not address_map.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    assert proc.poll() is None, "kproxy died when its log pipe closed"
    proc.terminate()
    assert proc.wait(timeout=15) == 0
