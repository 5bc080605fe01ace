# ruff: noqa: E501  (test names, docstrings and tables are kept whole to stay readable)
"""The ipvs mode's ipsets and iptables rules in a real kernel namespace agree with the emulator.

IPVS is not in this kernel, but ipset and iptables are: the rendered sets are loaded with
``ipset restore`` and the rules (with kube-proxy's jump rules, built by the emulator and saved)
with ``iptables-restore`` into a fresh namespace. Then (1) ``ipset test`` answers as the emulated
sets do for members and non-members of every set type; (2) UDP datagrams the namespace sends to
ClusterIPs, NodePorts, external and load-balancer IPs (delivered locally, as without IPVS) hit
the ``-m set`` rules exactly as the emulator's replay of the same packets does, compared through
``iptables-save -c`` counters. The one rule using ``-m ipvs`` (which needs IPVS in the kernel)
is left out of both; ``kube-ipvs0`` and ``eth1`` are veth devices (no dummy driver here).
"""

from __future__ import annotations

import asyncio
import random
import subprocess

import pytest

from emulation import Interface, ManualClock, Node, Packet, Route
from emulation.ipset import load_save
from emulation.netfilter import Netns, Ruleset, apply_restore, load
from kproxy.kernel import EmulatedNetfilter
from kproxy.modes.iptables.mode import ensure_jumps
from kproxy.modes.ipvs import JUMP_RULES, IpvsConfig, format_ipset_restore, render
from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns, sh
from tests.scenarios import NODE, NODE_IP, cluster
from tests.unit.modes.kube import snapshot_of

pytestmark = pytest.mark.kernel

CONFIG = IpvsConfig(node_ips=(NODE_IP,), cluster_cidr=("10.0.0.0/8",), random_fully=False)
#: (set, element) probes: members and near misses of every set type kube-proxy uses.
PROBES = [
    ("KUBE-CLUSTER-IP", "172.30.0.41,tcp:80"), ("KUBE-CLUSTER-IP", "172.30.0.41,udp:80"),
    ("KUBE-CLUSTER-IP", "172.30.0.41,udp:81"), ("KUBE-CLUSTER-IP", "172.30.0.53,sctp:80"),
    ("KUBE-LOOP-BACK", "10.180.0.1,tcp:8080,10.180.0.1"), ("KUBE-LOOP-BACK", "10.180.0.1,tcp:8080,10.180.0.2"),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "5.6.7.8,tcp:80,203.0.113.7"),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "5.6.7.8,tcp:80,203.0.113.130"),
    ("KUBE-NODE-PORT-TCP", "30003"), ("KUBE-NODE-PORT-TCP", "30004"), ("KUBE-NODE-PORT-LOCAL-TCP", "30007"),
    ("KUBE-HEALTH-CHECK-NODE-PORT", "30000"), ("KUBE-IPVS-IPS", "172.30.0.41"), ("KUBE-IPVS-IPS", NODE_IP),
    ("KUBE-EXTERNAL-IP-LOCAL", "192.168.99.22,tcp:80"), ("KUBE-LOAD-BALANCER-LOCAL", "5.6.7.8,tcp:80"),
]
#: UDP datagrams the node sends: (destination, port).
SENDS = [("172.30.0.41", 81), ("172.30.0.41", 80), ("172.30.0.42", 80), (NODE_IP, 30003), (NODE_IP, 30004),
         ("192.168.99.33", 80), ("5.6.7.8", 80), ("172.30.0.46", 80)]
SPORT = 41000
_SENDER = r"""
import socket, sys
src, sport = sys.argv[1], int(sys.argv[2])
targets = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in sys.argv[3:]]
listeners = []
for port in sorted({p for _, p in targets}):
    l = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); l.bind(("0.0.0.0", port)); listeners.append(l)
for dst, port in targets:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((src, sport))
    s.sendto(b"x" * 16, (dst, port)); s.close()
"""


def _rendered() -> tuple[str, str, tuple[str, ...]]:
    out = render(snapshot_of(cluster(), hostname=NODE), CONFIG)
    rules = "".join(line + "\n" for line in out.iptables.splitlines() if "-m ipvs" not in line)
    return format_ipset_restore(out.state), rules, out.state.bound_addresses


def _node(bound: tuple[str, ...]) -> Node:
    return Node(interfaces=(Interface(name="eth1", addresses=(f"{NODE_IP}/24",)),
                            Interface(name="kube-ipvs0", addresses=tuple(f"{a}/32" for a in bound))),
                routes=(Route(destination="default", device="eth1", via="192.168.0.3"),), route_localnet=True)


def _set_rules(saved: str) -> dict[str, tuple[int, int]]:
    """``{rule text: (packets, bytes)}`` of every ``-m set`` rule in ``iptables-save -c`` text."""
    out = {}
    for line in saved.splitlines():
        if line.startswith("[") and "--match-set" in line:
            counts, _, rule = line.partition("] ")
            p, b = counts.lstrip("[").split(":")
            out[rule] = (int(p), int(b))
    return out


def test_ipset_test_and_set_rule_counters_agree_with_the_emulator() -> None:
    """ipset test answers and -m set rule counters are the same in the kernel and the emulator."""
    require_kernel("ipset", "iptables-restore", "iptables-save")
    cleanup_stale()
    sets_text, rules_text, bound = _rendered()
    emulated = Netns(_node(bound), ManualClock(), ruleset=Ruleset(4))
    tables = load_save(sets_text, exist=True)
    emulated.set_lookup = tables.lookup
    jumps = EmulatedNetfilter(Netns(_node(bound), ManualClock(), ruleset=Ruleset(4)))
    asyncio.run(ensure_jumps(jumps, JUMP_RULES))
    ruleset = apply_restore(jumps.netns.ruleset, rules_text, noflush=True)
    emulated.ruleset = load(ruleset_text := _save(ruleset), version=4)
    with netns("ipvs") as ns:
        for dev in ("eth1", "kube-ipvs0"):  # veth pairs: this kernel has no dummy driver
            sh("ip", "-n", ns, "link", "add", dev, "type", "veth", "peer", "name", f"{dev[:8]}-p")
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", f"{dev[:8]}-p", "up")
        sh("ip", "-n", ns, "addr", "add", f"{NODE_IP}/24", "dev", "eth1")
        for addr in bound:
            sh("ip", "-n", ns, "addr", "add", f"{addr}/32", "dev", "kube-ipvs0")
        sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1")
        try:
            subprocess.run(["ip", "netns", "exec", ns, "ipset", "-exist", "restore"], input=sets_text, text=True,
                           check=True, capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "exec", ns, "iptables-restore"], input=ruleset_text, text=True,
                           check=True, capture_output=True, timeout=30)
            for name, elem in PROBES:
                kernel = sh("ip", "netns", "exec", ns, "ipset", "test", name, elem, check=False).returncode == 0
                assert kernel == tables.get(name).test(elem), (name, elem)
            sh("ip", "netns", "exec", ns, "python3", "-c", _SENDER, NODE_IP, str(SPORT),
               *(f"{d}:{p}" for d, p in SENDS))
            for dst, port in SENDS:
                emulated.send(Packet(src=NODE_IP, dst=dst, sport=SPORT, dport=port, protocol="udp", length=44),
                              random.Random(0))
            kernel_counts = _set_rules(sh("ip", "netns", "exec", ns, "iptables-save", "-c").stdout)
            emulator_counts = _set_rules(emulated.save(counters=True))
            assert kernel_counts and kernel_counts == emulator_counts
            assert sum(p for p, _ in kernel_counts.values()) >= len(SENDS), kernel_counts
        finally:
            sh("ip", "netns", "exec", ns, "ipset", "destroy", check=False)


def _save(ruleset: Ruleset) -> str:
    from emulation.netfilter import save

    return save(ruleset)
