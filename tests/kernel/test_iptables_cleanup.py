"""``--cleanup`` in a real namespace: kube-proxy's chains and jumps go, another component's rules stay."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from kproxy.kernel import LinuxNetfilter, LinuxNftables
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer, program
from kproxy.modes.iptables.cleanup import cleanup
from kproxy.modes.nftables import NftablesConfig, NftablesMode
from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns, sh
from tests.scenarios import NODE, cluster
from tests.unit.modes.kube import snapshot_of

pytestmark = pytest.mark.kernel

DOCKER = ("*nat\n:DOCKER - [0:0]\n-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE\nCOMMIT\n"
          "*filter\n:DOCKER-USER - [0:0]\n-A FORWARD -j DOCKER-USER\nCOMMIT\n")


def _kube(save: str) -> list[str]:
    return [line for line in save.splitlines() if "KUBE-" in line and "KUBE-FIREWALL" not in line]


def test_cleanup_in_the_kernel_removes_kube_proxy_rules_and_keeps_others() -> None:
    """A full sync then cleanup leaves Docker's rules and kubelet's chain in iptables-save, none of ours."""
    require_kernel("iptables-restore", "iptables-save", "iptables")
    cleanup_stale()
    with netns("cleanup") as ns:
        kernel = LinuxNetfilter(netns=ns)
        asyncio.run(kernel.restore(DOCKER))
        config = IptablesConfig(node_ips=("192.168.0.2",), cluster_cidr=("10.0.0.0/8",))
        asyncio.run(program(kernel, IptablesRenderer(config).render(snapshot_of(cluster(), hostname=NODE))))
        before = sh("ip", "netns", "exec", ns, "iptables-save").stdout
        assert len(_kube(before)) > 20
        assert asyncio.run(cleanup(kernel)) == []
        after = sh("ip", "netns", "exec", ns, "iptables-save").stdout
        assert _kube(after) == []
        assert "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE" in after
        assert "-A FORWARD -j DOCKER-USER" in after
        assert asyncio.run(cleanup(kernel)) == []


def test_kproxy_run_cleanup_in_a_namespace_removes_the_rules_and_exits_0() -> None:
    """`kproxy run --cleanup` run in a namespace removes kube-proxy's rules there and exits 0."""
    require_kernel("iptables-restore", "iptables-save", "iptables")
    cleanup_stale()
    with netns("runcleanup") as ns:
        kernel = LinuxNetfilter(netns=ns)
        config = IptablesConfig(node_ips=("192.168.0.2",), cluster_cidr=("10.0.0.0/8",))
        asyncio.run(program(kernel, IptablesRenderer(config).render(snapshot_of(cluster(), hostname=NODE))))
        assert _kube(sh("ip", "netns", "exec", ns, "iptables-save").stdout)
        done = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "kproxy", "run", "--cleanup"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert _kube(sh("ip", "netns", "exec", ns, "iptables-save").stdout) == []


def test_cleanup_of_an_emulated_kernel_is_a_usage_error() -> None:
    """`--cleanup --kernel emulated` exits 2 saying an emulated kernel goes with its process."""
    done = subprocess.run([sys.executable, "-m", "kproxy", "run", "--cleanup", "--kernel", "emulated"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "emulated kernel lives only inside a running kproxy" in done.stderr


def test_kproxy_run_cleanup_deletes_the_nftables_tables_and_keeps_others() -> None:
    """`kproxy run --cleanup` deletes the nftables mode's `ip kube-proxy` table and leaves another table."""
    require_kernel("nft", "iptables-restore", "iptables-save", "iptables")
    cleanup_stale()
    with netns("nftcleanup") as ns:
        kernel = LinuxNftables(netns=ns)
        mode = NftablesMode(NftablesConfig(node_ips=("192.168.0.2",)), kernel, now=lambda: 0.0)
        asyncio.run(mode.apply(snapshot_of(cluster(), hostname=NODE)))
        asyncio.run(kernel.run("add table inet firewall\n"))
        done = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "kproxy", "run", "--cleanup"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        listing = sh("ip", "netns", "exec", ns, "nft", "list", "tables").stdout
        assert "kube-proxy" not in listing and "table inet firewall" in listing
