"""Benchmark the IPVS model: scheduling decisions per second and established-connection lookups.

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_ipvs.py [--seconds 0.5] [--iptables-services N | --no-iptables]

For every scheduler, with 10 and 1,000 real servers on one virtual service, it measures:

* ``decide/s``: scheduler decisions alone (``Service.schedule``, the kernel's ``->schedule``);
* ``new conn/s``: whole first packets through ``IpvsTable.process`` (lookup miss, service
  lookup, scheduling, connection entry, TCP transition, timer);

then the rate of packets of established connections (a hash lookup and a state transition)
with 10,000 connections in the table, and beside them the netfilter emulator's new-flow rate
for a kube-proxy iptables ruleset of N Services -- the constant cost of IPVS against the linear
cost of iptables chains that the Kubernetes documentation describes. Figures are the best of
three rounds of ``--seconds`` each.
"""

from __future__ import annotations

import argparse
import ipaddress
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from emulation.ipvs import (
    DestSpec,
    IpvsTable,
    SchedInput,
    ServiceKey,
    ServiceSpec,
    parse_address,
)
from emulation.packet import Packet

SCHEDULERS = ("rr", "wrr", "lc", "wlc", "sed", "nq", "fo", "ovf", "sh", "dh", "mh")
VIP = "10.96.0.1"


def best_rate(fn: Callable[[int], None], seconds: float) -> float:
    """Calls of ``fn(i)`` per second, best of three rounds of about ``seconds``."""
    best = 0.0
    i = 0
    for _ in range(3):
        n = 0
        t0 = time.perf_counter()
        while True:
            for _ in range(200):
                fn(i)
                i += 1
            n += 200
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
        best = max(best, n / dt)
    return best


def build(scheduler: str, servers: int) -> IpvsTable:
    """One TCP service with ``servers`` real servers (wrr gets weights 1..3)."""
    t = IpvsTable()
    v, a = parse_address(VIP)
    key = ServiceKey(v, "tcp", a, 80)
    t.add_service(ServiceSpec(key=key, scheduler=scheduler))
    base = int(ipaddress.IPv4Address("10.244.0.0"))
    for i in range(servers):
        w = 1 + i % 3 if scheduler == "wrr" else 1
        t.add_dest(key, DestSpec(addr=(4, base + i + 1), port=8080, weight=w))
    return t


def sources(n: int) -> list[str]:
    rng = random.Random(7)
    return [str(ipaddress.IPv4Address(rng.getrandbits(32) | 0x01000000)) for _ in range(n)]


def bench_scheduler(scheduler: str, servers: int, seconds: float) -> tuple[float, float]:
    t = build(scheduler, servers)
    svc = t.services()[0]
    srcs = [parse_address(s)[1] for s in sources(4096)]
    vip = svc.spec.key.addr
    inputs = [SchedInput(4, s, 1024 + i % 60000, vip, 80, "tcp") for i, s in enumerate(srcs)]
    decide = best_rate(lambda i: svc.schedule(inputs[i & 4095]), seconds)
    t2 = build(scheduler, servers)
    texts = sources(4096)
    clock = [0.0]

    def new_conn(i: int) -> None:
        # Distinct 4-tuples; 0.5 ms apart so SYN_RECV entries (60 s) also expire as they would.
        clock[0] += 0.0005
        t2.process(Packet(src=texts[i & 4095], dst=VIP, sport=1024 + (i >> 12) % 60000, dport=80), clock[0])

    return decide, best_rate(new_conn, seconds)


def bench_established(seconds: float) -> float:
    t = build("rr", 10)
    texts = sources(10000)
    pkts = [Packet(src=s, dst=VIP, sport=40000, dport=80) for s in texts]
    for p in pkts:
        t.process(p, 0.0)
    acks = [Packet(src=s, dst=VIP, sport=40000, dport=80, syn=False) for s in texts]
    return best_rate(lambda i: t.process(acks[i % 10000], 1.0, flags="A"), seconds)


def bench_iptables(services: int, seconds: float) -> float | None:
    try:
        from emulation.clock import ManualClock
        from emulation.netfilter import Netns, load
        from emulation.node import Interface, Node, Route
        from tests.benchmarks.bench_netfilter import kube_ruleset
    except ImportError as e:  # the netfilter model is being reworked elsewhere
        print(f"(iptables emulator not measured: {e})")
        return None
    node = Node(
        interfaces=(
            Interface(name="eth0", addresses=("192.168.0.2/24",)),
            Interface(name="cni0", addresses=("10.0.0.1/8",)),
        ),
        routes=(Route(destination="default", device="eth0", via="192.168.0.1"),),
    )
    ns = Netns(node, ManualClock(), ruleset=load(kube_ruleset(services, 10)))
    rng = random.Random(1)

    def send(i: int) -> None:
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

    return best_rate(send, seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--iptables-services", type=int, default=10000)
    ap.add_argument("--no-iptables", action="store_true")
    args = ap.parse_args()
    print(f"{'scheduler':<10}{'servers':>8}{'decide/s':>14}{'new conn/s':>14}")
    for name in SCHEDULERS:
        for servers in (10, 1000):
            decide, new = bench_scheduler(name, servers, args.seconds)
            print(f"{name:<10}{servers:>8}{decide:>14,.0f}{new:>14,.0f}")
    rate = bench_established(args.seconds)
    print(f"\nestablished connections (10,000 in the table): {rate:,.0f} packets/s")
    if not args.no_iptables:
        n = args.iptables_services
        ipt = bench_iptables(n, args.seconds)
        if ipt is not None:
            print(f"iptables emulator, {n:,} Services x 10 endpoints: {ipt:,.0f} new-flow packets/s")


if __name__ == "__main__":
    main()
