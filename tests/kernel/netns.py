"""Network namespaces for real-kernel tests: created by the test, always deleted after.

Only traffic inside namespaces a test created (or on loopback) is ever sent.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

PREFIX = "kproxy-test-"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; raise with its stderr when it fails."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def cleanup_stale() -> None:
    """Delete namespaces that an earlier, killed run of this suite left behind.

    Names end in the creating process's pid; namespaces of a live process (this run, or
    another run going on at the same time) are left alone.
    """
    listing = sh("ip", "netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX):
            continue
        pid = name.rsplit("-", 1)[-1]
        if pid.isdigit() and _alive(int(pid)):
            continue
        sh("ip", "netns", "delete", name, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def netns(tag: str) -> Iterator[str]:
    """Create a namespace named ``kproxy-test-<tag>-<pid>`` with ``lo`` up; delete it after."""
    name = f"{PREFIX}{tag}-{os.getpid()}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        sh("ip", "netns", "delete", name, check=False)


def veth(ns_a: str, addr_a: str, ns_b: str, addr_b: str, tag: str) -> None:
    """Link two namespaces with a veth pair; ``addr_*`` are CIDRs like ``10.244.1.1/24``."""
    a, b = f"kpa{tag}", f"kpb{tag}"
    sh("ip", "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b, "netns", ns_b)
    sh("ip", "-n", ns_a, "addr", "add", addr_a, "dev", a)
    sh("ip", "-n", ns_b, "addr", "add", addr_b, "dev", b)
    sh("ip", "-n", ns_a, "link", "set", a, "up")
    sh("ip", "-n", ns_b, "link", "set", b, "up")
