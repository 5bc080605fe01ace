"""Cgroups, namespaces and clients for the socket-LB suites: all made by the test, removed after.

A cgroup v2 folder is made under :data:`CGROUP_ROOT` and removed after (its processes have
exited by then). Clients are separate processes entered into a namespace with
``nsenter --net=`` (``ip netns exec`` would remount ``/sys`` and hide the cgroup2 mount); a
client joins the cgroup by writing its own pid to ``cgroup.procs`` before it connects, so only
its own sockets are translated.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.kernel.harness import CLONE_NEWNET

_LIBC = ctypes.CDLL(None, use_errno=True)

CGROUP_ROOT = "/sys/fs/cgroup/unified"

_CLIENT = r"""
import json, os, socket, sys
cgroup, proto, host, port, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if cgroup:
    with open(cgroup + "/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
family = socket.AF_INET6 if ":" in host else socket.AF_INET
out = []
for _ in range(count):
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    s = socket.socket(family, kind)
    s.settimeout(5)
    try:
        cookie = int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 57, 8), "little")  # SO_COOKIE
        if proto == "udp-unconnected":
            s.sendto(b"ping", (host, port))
            data, src = s.recvfrom(64)
            out.append({"reply": data.decode(), "peer": "%s:%d" % src[:2], "cookie": cookie})
            continue
        s.connect((host, port))
        peer = "%s:%d" % s.getpeername()[:2]
        if proto == "udp":
            s.send(b"ping")
        reply = s.recv(64).decode()
        out.append({"reply": reply, "peer": peer, "cookie": cookie})
    except OSError as e:
        out.append({"error": e.errno})
    finally:
        s.close()
print(json.dumps(out))
"""


def cleanup_stale_cgroups() -> None:
    """Remove empty ``kproxy-test-*`` cgroups an earlier, killed run left (pid no longer alive)."""
    for name in os.listdir(CGROUP_ROOT):
        pid = name.rsplit("-", 1)[-1]
        if not name.startswith("kproxy-test-") or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):  # still has processes: left alone
                os.rmdir(os.path.join(CGROUP_ROOT, name))
        except PermissionError:
            pass


@contextmanager
def cgroup(tag: str) -> Iterator[str]:
    """A new cgroup v2 folder ``kproxy-test-<tag>-<pid>``; removed after."""
    cleanup_stale_cgroups()
    path = os.path.join(CGROUP_ROOT, f"kproxy-test-{tag}-{os.getpid()}")
    os.mkdir(path)
    try:
        yield path
    finally:
        os.rmdir(path)


def clients(ns: str, host: str, port: int, *, cgroup_path: str = "", proto: str = "tcp",
            count: int = 1) -> list[dict[str, object]]:
    """``count`` connects from one new process in ``ns`` (in ``cgroup_path`` when given): each
    the reply's text and the peer ``getpeername`` gave, or the connect's errno."""
    proc = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c", _CLIENT,
                           cgroup_path, proto, host, str(port), str(count)],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"client failed: {proc.stderr.strip()}")
    result: list[dict[str, object]] = json.loads(proc.stdout)
    return result


@contextmanager
def server(ns: str, ip: str, port: int, answer: str, *, udp: bool = False) -> Iterator[None]:
    """A listener in ``ns`` on ``ip:port`` that answers every connection (datagram) ``answer``."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = _netns_socket(ns, family, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((ip, port))
    if not udp:
        sock.listen(64)
    sock.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                if udp:
                    _, addr = sock.recvfrom(64)
                    sock.sendto(answer.encode(), addr)
                else:
                    conn, _ = sock.accept()
                    with conn:
                        conn.sendall(answer.encode())
            except OSError:
                continue

    thread = threading.Thread(target=loop, name=f"server-{ip}:{port}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()


def _netns_socket(ns: str, family: int, kind: int) -> socket.socket:
    """A socket of ``family``/``kind`` made by a short-lived thread that entered ``ns``."""
    box: list[socket.socket | BaseException] = []

    def enter_and_open() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _LIBC.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            box.append(socket.socket(family, kind))
        except BaseException as e:  # handed to the caller
            box.append(e)

    thread = threading.Thread(target=enter_and_open, name=f"open-in-{ns}", daemon=True)
    thread.start()
    thread.join(timeout=10)
    if not box:
        raise RuntimeError(f"opening a socket in {ns} did not finish")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def dumps(obj: object) -> str:
    """Stable JSON for failure messages."""
    return json.dumps(obj, sort_keys=True)
