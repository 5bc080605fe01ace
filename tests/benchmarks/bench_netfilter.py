# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Emulator throughput with N kube-proxy-like services (not a test; run as a script).

    .venv/bin/python -m tests.emulation.bench_netfilter [services] [endpoints]

Prints new-flow packets per second in sample mode (tracing off), enumerate mode, and traced.
"""

from __future__ import annotations

import random
import sys
import time

from emulation.clock import ManualClock
from emulation.netfilter import Netns, load
from emulation.node import Interface, Node, Route
from emulation.packet import Packet


def kube_ruleset(services: int, endpoints: int) -> str:
    """A nat + filter dump shaped like kube-proxy's for ``services`` ClusterIP services."""
    chains = [
        ":KUBE-SERVICES - [0:0]",
        ":KUBE-POSTROUTING - [0:0]",
        ":KUBE-MARK-MASQ - [0:0]",
        ":KUBE-NODEPORTS - [0:0]",
    ]
    rules = [
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000",
        "-A KUBE-POSTROUTING -j MASQUERADE --random-fully",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
    ]
    svc_rules = []
    for s in range(services):
        vip = f"172.30.{s // 250}.{s % 250 + 1}"
        svc = f"KUBE-SVC-{s:012d}"
        chains.append(f":{svc} - [0:0]")
        svc_rules.append(
            f'-A KUBE-SERVICES -m comment --comment "ns/svc{s}:p cluster IP" -m tcp -p tcp -d {vip} '
            f"--dport 80 -j {svc}"
        )
        rules.append(f"-A {svc} -m tcp -p tcp -d {vip} --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ")
        for e in range(endpoints):
            sep = f"KUBE-SEP-{s:08d}{e:04d}"
            ip = f"10.{1 + (s * endpoints + e) // 65000}.{(s * endpoints + e) // 250 % 250}.{(s * endpoints + e) % 250 + 1}"
            chains.append(f":{sep} - [0:0]")
            stat = (
                f"-m statistic --mode random --probability {1 / (endpoints - e):.10f} "
                if e < endpoints - 1
                else ""
            )
            rules.append(f"-A {svc} {stat}-j {sep}")
            rules.append(f"-A {sep} -s {ip} -j KUBE-MARK-MASQ")
            rules.append(f"-A {sep} -m tcp -p tcp -j DNAT --to-destination {ip}:8080")
    svc_rules.append("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS")
    nat = "\n".join(
        [
            "*nat",
            ":PREROUTING ACCEPT [0:0]",
            ":INPUT ACCEPT [0:0]",
            ":OUTPUT ACCEPT [0:0]",
            ":POSTROUTING ACCEPT [0:0]",
            *chains,
            *rules,
            *svc_rules,
            "COMMIT",
        ]
    )
    filt = "\n".join(
        [
            "*filter",
            ":INPUT ACCEPT [0:0]",
            ":FORWARD ACCEPT [0:0]",
            ":OUTPUT ACCEPT [0:0]",
            ":KUBE-FORWARD - [0:0]",
            "-A FORWARD -j KUBE-FORWARD",
            "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
            "-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT",
            "COMMIT",
        ]
    )
    return nat + "\n" + filt + "\n"


def main() -> None:
    services = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    endpoints = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    text = kube_ruleset(services, endpoints)
    t0 = time.perf_counter()
    rs = load(text)
    print(
        f"{services} services x {endpoints} endpoints: {text.count(chr(10))} lines, load {time.perf_counter() - t0:.1f} s"
    )
    node = Node(
        interfaces=(
            Interface(name="eth0", addresses=("192.168.0.2/24",)),
            Interface(name="cni0", addresses=("10.0.0.1/8",)),
        ),
        routes=(Route(destination="default", device="eth0", via="192.168.0.1"),),
    )
    ns = Netns(node, ManualClock(), ruleset=rs)
    rng = random.Random(1)
    n = 20000
    t0 = time.perf_counter()
    for i in range(n):
        s = rng.randrange(services)
        ns.send(
            Packet(
                src="203.0.113.2",
                dst=f"172.30.{s // 250}.{s % 250 + 1}",
                sport=1024 + i % 60000,
                dport=80,
                in_interface="eth0",
            ),
            rng,
        )
    dt = time.perf_counter() - t0
    print(f"sample, tracing off: {n / dt:,.0f} new-flow packets/s")
    m = 500
    t0 = time.perf_counter()
    for i in range(m):
        s = rng.randrange(services)
        ns.enumerate(
            Packet(
                src="203.0.113.2",
                dst=f"172.30.{s // 250}.{s % 250 + 1}",
                sport=i,
                dport=80,
                in_interface="eth0",
            )
        )
    print(f"enumerate ({endpoints} outcomes each): {m / (time.perf_counter() - t0):,.0f} packets/s")
    t0 = time.perf_counter()
    out = ns.send(
        Packet(src="203.0.113.2", dst="172.30.39.250", sport=9, dport=80, in_interface="eth0"),
        rng,
        trace=True,
    )
    print(f"one traced packet: {len(out.trace)} steps in {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    main()
