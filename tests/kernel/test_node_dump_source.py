"""A flannel-like node in network namespaces: the source each backend sees, and the emulator's
prediction from the node's own `kproxy node-dump`.

The node namespace has ``eth0`` 192.168.60.2/24 (a veth to the client namespace), a ``cni0``
bridge 10.244.0.1/24 whose port leads to a pod namespace (10.244.0.5), and ``flannel.1``
10.244.0.0/32 (a veth standing for the VXLAN device; no loadable modules here) with flannel's
``10.244.1.0/24 via 10.244.1.0 onlink`` route to a remote namespace holding a pod 10.244.1.7.
kube-proxy-shaped rules (KUBE-SERVICES, KUBE-MARK-MASQ, KUBE-POSTROUTING ``MASQUERADE
--random-fully``) are loaded with ``iptables-restore``. Each backend answers with the peer
address it saw; real TCP connections are made, and ``kproxy trace --node-dump`` on the
namespace's dump must name the same source address (the port too when nothing translated it).
The kernel masquerades to the out interface's address: 10.244.0.1 towards cni0, 10.244.0.0
towards flannel.1, never the node IP of eth0, which the one-interface model would say; and the
node calling the ``kubernetes`` Service whose endpoint is itself keeps its own address.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kproxy.cli.main import main
from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns, sh

pytestmark = pytest.mark.kernel

#: kube-proxy-shaped nat rules for the node, as iptables-save prints them.
RULES = (Path(__file__).parent / "data" / "flannel-node.rules").read_text()

#: Answers each connection with the peer address it saw, for at most 30 seconds.
SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16); s.settimeout(1.0)
print("ready", flush=True)
end = time.monotonic() + 30
while time.monotonic() < end:
    try:
        c, peer = s.accept()
    except socket.timeout:
        continue
    c.sendall(f"{peer[0]}:{peer[1]}".encode()); c.close()
"""

CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5,
                             source_address=(sys.argv[3], int(sys.argv[4])))
print(s.recv(100).decode())
"""


def _ns_python(ns: str, script: str, *args: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c", script, *args]


def _flannel_node(node: str, client: str, pod: str, remote: str) -> None:
    def ip(*args: str) -> None:
        sh("ip", *args)

    ip("link", "add", "eth0", "netns", node, "type", "veth", "peer", "name", "c0", "netns", client)
    ip("-n", node, "addr", "add", "192.168.60.2/24", "dev", "eth0")
    ip("-n", client, "addr", "add", "192.168.60.9/24", "dev", "c0")
    ip("-n", node, "link", "add", "cni0", "type", "bridge")
    ip("-n", node, "addr", "add", "10.244.0.1/24", "dev", "cni0")
    ip("link", "add", "vethpod", "netns", node, "type", "veth", "peer", "name", "p0", "netns", pod)
    ip("-n", node, "link", "set", "vethpod", "master", "cni0")
    ip("-n", pod, "addr", "add", "10.244.0.5/24", "dev", "p0")
    ip("link", "add", "flannel.1", "netns", node, "type", "veth", "peer", "name", "r0", "netns", remote)
    ip("-n", node, "addr", "add", "10.244.0.0/32", "dev", "flannel.1")
    ip("-n", remote, "addr", "add", "10.244.1.0/24", "dev", "r0")
    ip("-n", remote, "addr", "add", "10.244.1.7/24", "dev", "r0")
    for ns, dev in ((node, "eth0"), (node, "cni0"), (node, "vethpod"), (node, "flannel.1"), (client, "c0"),
                    (pod, "p0"), (remote, "r0")):
        ip("-n", ns, "link", "set", dev, "up")
    ip("-n", node, "route", "add", "10.244.1.0/24", "via", "10.244.1.0", "dev", "flannel.1", "onlink")
    ip("-n", node, "route", "add", "default", "via", "192.168.60.9", "dev", "eth0")
    ip("-n", client, "route", "add", "default", "via", "192.168.60.2")
    ip("-n", pod, "route", "add", "default", "via", "10.244.0.1")
    ip("-n", remote, "route", "add", "10.244.0.0/16", "via", "10.244.0.0", "dev", "r0", "onlink")
    sh("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    subprocess.run(["ip", "netns", "exec", node, "iptables-restore"], input=RULES, text=True, check=True,
                   timeout=30)


@pytest.fixture(scope="module")
def flannel() -> Iterator[tuple[dict[str, str], Path]]:
    """The namespaces by role, and the node's dump written by ``kproxy node-dump`` inside it."""
    require_kernel("iptables-restore", "iptables-save", "nsenter")
    cleanup_stale()
    with netns("fl-node") as node, netns("fl-client") as client, netns("fl-pod") as pod, \
            netns("fl-remote") as remote:
        _flannel_node(node, client, pod, remote)
        servers = [subprocess.Popen(_ns_python(ns, SERVER, addr, port), stdout=subprocess.PIPE, text=True)
                   for ns, addr, port in ((pod, "10.244.0.5", "8080"), (remote, "10.244.1.7", "8080"),
                                          (node, "192.168.60.2", "6443"))]
        try:
            for s in servers:
                assert s.stdout is not None and s.stdout.readline().strip() == "ready"
            out = Path(f"/tmp/kproxy-test-fl-dump-{node.rsplit('-', 1)[-1]}")
            argv = ["nsenter", f"--net=/run/netns/{node}", sys.executable, "-m", "kproxy", "node-dump",
                    "--out", str(out)]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            yield {"node": node, "client": client, "pod": pod, "remote": remote}, out
        finally:
            for s in servers:
                s.kill()
                s.wait(timeout=5)
            subprocess.run(["rm", "-rf", f"/tmp/kproxy-test-fl-dump-{node.rsplit('-', 1)[-1]}"], check=False)


def _seen(ns: str, dst: str, port: int, src: str, sport: int) -> str:
    for _ in range(3):  # the first SYN of a fresh namespace may wait on ARP
        done = subprocess.run(_ns_python(ns, CLIENT, dst, str(port), src, str(sport)), capture_output=True,
                              text=True, timeout=20)
        if done.returncode == 0:
            return done.stdout.strip()
        time.sleep(0.2)
    raise AssertionError(f"{src}:{sport} -> {dst}:{port} in {ns}: {done.stderr.strip()}")


def _predicted(dump: Path, src: str, dst: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert main(["trace", "--node-dump", str(dump), "--node-ip", "192.168.60.2", "--src", src, "--dst", dst,
                 "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


CASES = [  # (namespace role, source, destination, masqueraded)
    ("client", "192.168.60.9:41001", "10.96.0.10:80", True),
    ("client", "192.168.60.9:41002", "10.96.0.11:80", True),
    ("client", "192.168.60.9:41003", "192.168.60.2:30080", True),
    ("node", "192.168.60.2:41004", "10.96.0.10:80", True),
    ("node", "192.168.60.2:41005", "10.96.0.11:80", True),
    ("pod", "10.244.0.5:41006", "10.96.0.11:80", False),
    # the node calls the kubernetes Service whose endpoint is itself: out lo, whose 127.0.0.1 is
    # host-scope, so MASQUERADE keeps the node's own address (not 127.0.0.1)
    ("node", "192.168.60.2:41007", "10.96.0.1:443", True),
]


@pytest.mark.parametrize(("role", "src", "dst", "masq"), CASES, ids=[f"{r}-{d}" for r, _, d, _ in CASES])
def test_the_emulator_with_the_nodes_dump_predicts_the_source_the_backend_sees(
        flannel: tuple[dict[str, str], Path], capsys: pytest.CaptureFixture[str],
        role: str, src: str, dst: str, masq: bool) -> None:
    spaces, dump = flannel
    s_ip, s_port = src.split(":")
    d_ip, d_port = dst.split(":")
    seen = _seen(spaces[role], d_ip, int(d_port), s_ip, int(s_port))
    predicted = _predicted(dump, src, dst, capsys)
    assert predicted["verdict"] == "ACCEPT"
    endpoints = predicted["endpoints"]
    assert isinstance(endpoints, list) and len(endpoints) == 1
    source = str(endpoints[0]["source"])
    if masq:
        assert source.split(":")[0] == seen.split(":")[0], (predicted, seen)
        assert predicted["snat"] == {"target": "MASQUERADE", "address": seen.split(":")[0]}
    else:
        assert source == seen == src
        assert predicted["snat"] is None


def test_node_dump_writes_the_contracts_files_as_the_tools_print_them(
        flannel: tuple[dict[str, str], Path]) -> None:
    _, dump = flannel
    names = {p.name for p in dump.iterdir()}
    assert {"iptables-save.txt", "ip-addr.json", "ip-route.json", "ip6-route.json", "ip-link.json",
            "sysctl.txt"} <= names
    links = {e["ifname"]: e.get("master") for e in json.loads((dump / "ip-link.json").read_text())}
    assert links["vethpod"] == "cni0"
    assert "net.ipv4.ip_forward = 1" in (dump / "sysctl.txt").read_text()
    assert "-j MASQUERADE --random-fully" in (dump / "iptables-save.txt").read_text()


def test_without_a_node_dump_the_trace_says_it_assumes_one_interface(
        flannel: tuple[dict[str, str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, dump = flannel
    capsys.readouterr()
    assert main(["trace", "--iptables-save", str(dump / "iptables-save.txt"), "--node-ip", "192.168.60.2",
                 "--src", "192.168.60.9:41001", "--dst", "10.96.0.10:80", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("one interface eth0" in n for n in out["notes"])
    assert out["snat"] == {"target": "MASQUERADE", "address": "192.168.60.2"}  # what the kernel did not do
