"""Real-kernel checks: ipset restore into a namespace, save round trip, membership agreement."""

from __future__ import annotations

import pytest

from emulation.ipset import format_save, load_save
from tests.conftest import require_kernel
from tests.kernel.netns import netns, sh

pytestmark = pytest.mark.kernel

RESTORE = """create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
add KUBE-CLUSTER-IP 10.96.0.10,udp:53
add KUBE-CLUSTER-IP 10.96.0.10,tcp:53
create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
add KUBE-LOOP-BACK 10.244.1.2,tcp:8080,10.244.1.2
create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536
add KUBE-LOAD-BALANCER-SOURCE-CIDR 1.2.3.4,tcp:80,192.168.0.0/16
add KUBE-LOAD-BALANCER-SOURCE-CIDR 1.2.3.4,tcp:80,10.1.2.3
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
add KUBE-NODE-PORT-TCP 30080
add KUBE-NODE-PORT-TCP 31000
create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536 comment
add KUBE-IPVS-IPS 10.96.0.1 comment "default/kubernetes"
create NETS hash:net family inet hashsize 1024 maxelem 65536
add NETS 10.0.0.0/8
add NETS 1.1.1.1
create V6 hash:ip,port family inet6 hashsize 1024 maxelem 65536
add V6 fd00::1,tcp:80
"""

PROBES = [
    ("KUBE-CLUSTER-IP", "10.96.0.1,tcp:443"),
    ("KUBE-CLUSTER-IP", "10.96.0.1,udp:443"),
    ("KUBE-CLUSTER-IP", "10.96.0.10,tcp:53"),
    ("KUBE-CLUSTER-IP", "10.96.0.11,tcp:53"),
    ("KUBE-LOOP-BACK", "10.244.1.2,tcp:8080,10.244.1.2"),
    ("KUBE-LOOP-BACK", "10.244.1.2,tcp:8080,10.244.1.3"),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "1.2.3.4,tcp:80,192.168.7.7"),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "1.2.3.4,tcp:80,10.1.2.3"),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "1.2.3.4,tcp:80,10.1.2.4"),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "1.2.3.4,udp:80,192.168.7.7"),
    ("KUBE-NODE-PORT-TCP", "30080"),
    ("KUBE-NODE-PORT-TCP", "30081"),
    ("KUBE-IPVS-IPS", "10.96.0.1"),
    ("KUBE-IPVS-IPS", "10.96.0.2"),
    ("NETS", "10.99.0.1"),
    ("NETS", "1.1.1.1"),
    ("NETS", "1.1.1.2"),
    ("V6", "fd00::1,tcp:80"),
    ("V6", "fd00::2,tcp:80"),
]


def _restore(ns: str, text: str) -> None:
    import subprocess

    argv = ["ip", "netns", "exec", ns, "ipset", "restore"]
    proc = subprocess.run(argv, input=text, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def _canonical(text: str) -> list[str]:
    """Save text without the kernel-chosen bucketsize/initval, lines sorted (members come in hash order)."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "create":
            drop = {"bucketsize", "initval"}
            kept, i = [], 0
            while i < len(words):
                if words[i] in drop:
                    i += 2
                    continue
                kept.append(words[i])
                i += 1
            line = " ".join(kept)
        out.append(line)
    return sorted(out)


def test_kernel_save_round_trips_through_the_parser() -> None:
    """ipset save from a real kernel loads into the model and prints back the same text."""
    require_kernel("ipset")
    with netns("ipset") as ns:
        _restore(ns, RESTORE)
        saved = sh("ip", "netns", "exec", ns, "ipset", "save").stdout
        assert format_save(load_save(saved)) == saved
        assert _canonical(saved) == _canonical(RESTORE)


def test_membership_agrees_with_ipset_test() -> None:
    """For every probe, the model's test answers as `ipset test` does in the kernel."""
    require_kernel("ipset")
    model = load_save(RESTORE)
    with netns("ipsettest") as ns:
        _restore(ns, RESTORE)
        for name, elem in PROBES:
            kernel = sh("ip", "netns", "exec", ns, "ipset", "test", name, elem, check=False).returncode == 0
            assert model.get(name).test(elem) == kernel, (name, elem)
