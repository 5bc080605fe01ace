# ruff: noqa: E501  (nft rule text and command lines are kept whole)
"""``kproxy render --proxy-mode nftables --service-cidr``: the kernel drops unallocated ClusterIPs.

kube-proxy's nftables proxier (``cluster-ips-check``, reached from ``filter-output`` and
``filter-forward`` for new connections) rejects a ClusterIP's undefined ports (``@cluster-ips``)
and, when it knows the service CIDRs, drops every other address in them. The rendered
transaction is loaded with the real ``nft -f`` into a namespace made here, and real UDP
datagrams from that namespace tell the verdicts apart: a REJECT comes back as ECONNREFUSED, a
DROP on the output hook fails ``send()`` with EPERM and nothing comes back, and an address the
rules leave alone is routed to a peer namespace that forwards nothing and is never answered. (A TCP SYN dropped on the output hook is retransmitted, not refused, so it could
not be told from silence.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns, sh

pytestmark = pytest.mark.kernel
REPO = Path(__file__).resolve().parents[2]

#: Sends one UDP datagram to HOST PORT (IPv4 or IPv6) from a connected socket and prints the
#: verdict: "reject" (an ICMP port unreachable came back: ECONNREFUSED), "drop" (the send was
#: refused on the output hook, EPERM, and nothing came back) or "silent" (sent, never answered).
_SEND = """
import errno, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.5)
s.connect((host, port))
refused = False
try:
    s.send(b"kproxy")
except PermissionError:
    refused = True
try:
    s.recv(64)
    print("answered")
except ConnectionRefusedError:
    print("reject")
except socket.timeout:
    print("drop" if refused else "silent")
"""


def _render(tmp_path: Path, *extra: str) -> Path:
    argv = [sys.executable, "-m", "kproxy", "render", "-f", str(REPO / "examples" / "cluster.yaml"),
            "--proxy-mode", "nftables", "--hostname-override", "node-a", *extra]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True, cwd=REPO)
    script = tmp_path / f"kube-proxy-{len(list(tmp_path.iterdir()))}.nft"
    script.write_text(out.stdout)
    return script


def _verdicts(script: Path, targets: list[tuple[str, int]], *, ipv6: bool = False) -> list[str]:
    """Load ``script`` into a new namespace whose service range routes to a silent peer namespace
    (it forwards nothing), and send one datagram to each target from the first."""
    with netns("nftsvccidr") as ns, netns("nftsvcpeer") as peer:
        a, b = f"kpsc{os.getpid() % 100000}", f"kpsp{os.getpid() % 100000}"
        sh("ip", "link", "add", a, "netns", ns, "type", "veth", "peer", "name", b, "netns", peer)
        if ipv6:
            sh("ip", "-n", ns, "-6", "addr", "add", "fd00:99::1/64", "dev", a, "nodad")
            sh("ip", "-n", peer, "-6", "addr", "add", "fd00:99::2/64", "dev", b, "nodad")
        else:
            sh("ip", "-n", ns, "addr", "add", "10.200.0.1/24", "dev", a)
            sh("ip", "-n", peer, "addr", "add", "10.200.0.2/24", "dev", b)
        sh("ip", "-n", ns, "link", "set", a, "up")
        sh("ip", "-n", peer, "link", "set", b, "up")
        if ipv6:
            sh("ip", "-n", ns, "-6", "route", "add", "fd00:10::/32", "via", "fd00:99::2")
        else:
            sh("ip", "-n", ns, "route", "add", "10.96.0.0/12", "via", "10.200.0.2")
        sh("ip", "netns", "exec", ns, "nft", "-f", str(script))
        return [sh("ip", "netns", "exec", ns, sys.executable, "-c", _SEND, host, str(port)).stdout.strip()
                for host, port in targets]


def test_unallocated_clusterips_are_dropped_and_undefined_ports_rejected(tmp_path: Path) -> None:
    """With --service-cidr an unallocated address in it is dropped, a ClusterIP's undefined port is
    rejected, and an address outside the service CIDRs is left alone."""
    require_kernel("nft")
    cleanup_stale()
    script = _render(tmp_path, "--node-ip", "192.168.0.2", "--service-cidr", "10.96.0.0/16,fd00:10:96::/112")
    assert 'ip daddr { 10.96.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"' in script.read_text()
    targets = [("10.96.0.99", 80), ("10.96.0.10", 9999), ("10.97.0.5", 80)]
    assert _verdicts(script, targets) == ["drop", "reject", "silent"]


def test_without_service_cidr_unallocated_clusterips_are_not_dropped(tmp_path: Path) -> None:
    """Without --service-cidr kube-proxy knows no service range: only the undefined port is rejected."""
    require_kernel("nft")
    cleanup_stale()
    script = _render(tmp_path, "--node-ip", "192.168.0.2")
    assert "unallocated" not in script.read_text()
    assert _verdicts(script, [("10.96.0.99", 80), ("10.96.0.10", 9999)]) == ["silent", "reject"]


def test_ipv6_table_drops_only_its_own_family_service_cidr(tmp_path: Path) -> None:
    """The ip6 table gets the IPv6 service CIDR of a dual-stack --service-cidr, and drops in it."""
    require_kernel("nft")
    cleanup_stale()
    script = _render(tmp_path, "--node-ip", "2001:db8::2", "--ip-family", "IPv6",
                     "--service-cidr", "10.96.0.0/16,fd00:10:96::/112")
    text = script.read_text()
    assert "ip6 daddr { fd00:10:96::/112 } drop" in text and "10.96.0.0/16" not in text
    assert _verdicts(script, [("fd00:10:96::99", 80), ("fd00:10:97::5", 80)], ipv6=True) == ["drop", "silent"]
