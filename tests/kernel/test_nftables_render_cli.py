"""``kproxy render --proxy-mode nftables`` prints a transaction the kernel's nft loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns, sh

pytestmark = pytest.mark.kernel
REPO = Path(__file__).resolve().parents[2]


def test_rendered_nftables_transaction_loads_with_nft(tmp_path: Path) -> None:
    """The example cluster's nftables render loads with `nft -f` and lists kube-proxy's table."""
    require_kernel("nft")
    cleanup_stale()
    argv = [sys.executable, "-m", "kproxy", "render", "-f", str(REPO / "examples" / "cluster.yaml"),
            "--proxy-mode", "nftables", "--hostname-override", "node-a", "--node-ip", "192.168.0.2"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True, cwd=REPO)
    script = tmp_path / "kube-proxy.nft"
    script.write_text(out.stdout)
    with netns("nftrender") as ns:
        sh("ip", "netns", "exec", ns, "nft", "-f", str(script))
        listing = sh("ip", "netns", "exec", ns, "nft", "list", "table", "ip", "kube-proxy").stdout
    assert "chain services" in listing and "map service-ips" in listing
