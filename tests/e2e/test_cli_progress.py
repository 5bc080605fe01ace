"""Progress bars: shown on a terminal for long commands, never in piped output."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml")
VERIFY = [sys.executable, "-m", "kproxy", "verify", "--manifests", EXAMPLE, "--examples"]


def _read_all(fd: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out


def test_verify_on_a_terminal_shows_a_packet_progress_bar_and_erases_it() -> None:
    """With standard error on a terminal, a long verify draws "checking packets" with a count of 150."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))  # a 100-column terminal
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "100"}
    proc = subprocess.Popen([*VERIFY, "150"], stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    try:
        drawn = _read_all(master, proc, 300)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stdout
    assert b"checking packets" in drawn and b"/150" in drawn, drawn[-400:]
    assert b"agree on 150 packets" in stdout and b"checking packets" not in stdout


def test_verify_piped_prints_no_progress() -> None:
    """Standard error not a terminal: not one progress character is written."""
    out = subprocess.run([*VERIFY, "30"], capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert b"checking packets" not in out.stderr and b"\r" not in out.stderr
