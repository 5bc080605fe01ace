"""The userspace proxy across real network namespaces: node and pods joined by a veth pair.

kproxy runs in a "node" namespace; the pods run in a "pod" namespace reached over a veth, as
on a real node with a bridge-less CNI. Clients in the node namespace reach the Services
through kproxy, and replies come back through the real kernel's routing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns, sh, veth

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[2]

CLUSTER = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: demo}
  spec:
    clusterIP: 10.96.0.10
    ports:
    - {name: http, port: 80, targetPort: 8080}
    - {name: dns, port: 53, targetPort: 5353, protocol: UDP}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports:
  - {name: http, port: 8080}
  - {name: dns, port: 5353, protocol: UDP}
  endpoints:
  - addresses: [10.244.1.2]
  - addresses: [10.244.1.3]
"""

CLIENT = """
import json, socket, sys
table = json.load(open(sys.argv[1]))
out = {}
for row in table:
    host, _, port = row["listen"].rpartition(":")
    answers = []
    for i in range(6):
        if row["protocol"] == "TCP":
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(b"q\\n")
                answers.append(s.makefile().readline().split()[0])
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(5)
                s.sendto(b"q", (host, int(port)))
                data, peer = s.recvfrom(65535)
                assert peer == (host, int(port)), peer
                answers.append(data.decode().split()[0])
    out[row["service"] + "/" + row["protocol"]] = answers
print(json.dumps(out))
"""


def _wait_for(path: Path, predicate: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip() and predicate(path.read_text()):  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} not ready in {timeout_s} s")


def test_tcp_and_udp_through_kproxy_to_pods_across_a_veth(tmp_path: Path) -> None:
    """Both pods answer TCP and UDP through kproxy in the node namespace, replies included."""
    require_kernel()
    cleanup_stale()
    manifest = tmp_path / "cluster.yaml"
    manifest.write_text(CLUSTER)
    address_map = tmp_path / "addresses.json"
    ready = tmp_path / "backends.out"
    with netns("usnode") as node, netns("uspod") as pod:
        veth(node, "10.244.1.1/24", pod, "10.244.1.2/24", "u0")
        sh("ip", "-n", pod, "addr", "add", "10.244.1.3/24", "dev", "kpbu0")
        backends = subprocess.Popen(
            ["ip", "netns", "exec", pod, sys.executable, str(REPO / "examples" / "backends.py"),
             str(manifest)], stdout=ready.open("w"), stderr=subprocess.STDOUT, cwd=REPO)
        kproxy = subprocess.Popen(
            ["ip", "netns", "exec", node, sys.executable, "-m", "kproxy", "run", "--manifests",
             str(manifest), "--address-map", str(address_map), "--min-sync-period", "0s"],
            stderr=subprocess.PIPE, text=True, cwd=REPO)
        try:
            _wait_for(ready, lambda text: text.startswith("ready"), 15)
            _wait_for(address_map, lambda text: len(json.loads(text)) == 2, 15)
            client = sh("ip", "netns", "exec", node, sys.executable, "-c", CLIENT, str(address_map))
            answers = json.loads(client.stdout)
        finally:
            kproxy.terminate()
            _, err = kproxy.communicate(timeout=15)
            backends.terminate()
            backends.wait(timeout=15)
        assert kproxy.returncode == 0, err
    pods = {"10.244.1.2:8080", "10.244.1.3:8080"}
    assert set(answers["demo/web:http/TCP"]) == pods
    assert set(answers["demo/web:dns/UDP"]) == {"10.244.1.2:5353", "10.244.1.3:5353"}
