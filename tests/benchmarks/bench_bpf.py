"""Benchmark the BPF side of the eBPF mode: the machine's speed, map fills, one endpoint change,
and the connect latency through socket-LB as the number of Services grows.

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_bpf.py [--services 10000] [--endpoints 10]
        [--latency-services 1000,10000,20000] [--connects 300]

In one run:

a. the BPF machine's instructions per second on the tc DNAT program, beside the kernel's own
   ``BPF_PROG_TEST_RUN`` time per run of the same program (root);
b. filling the services and backends maps for N Services x M endpoints with Cilium's layout
   (master + M slots per Service, M backends), through ``BPF_MAP_UPDATE_BATCH``, beside one
   ``BPF_MAP_UPDATE_ELEM`` per entry (root; the emulated maps otherwise). Target < 2 s;
c. one endpoint change (a backend replaced in one Service): map operations and time. Target
   < 1 ms;
d. the median connect latency from a process in a cgroup with socket-LB linked, at each
   Service count, beside the same connects to the backend with nothing linked (root).

Every map here is made for the run and closed after; the namespace and cgroup of (d) too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from emulation.bpf import ProgType, SkBuff  # noqa: E402
from kproxy.kernel.bpf import BpfKernel, EmulatedBpf, ProgramSpec  # noqa: E402
from kproxy.kernel.linux_bpf import LinuxBpf, bpf_available  # noqa: E402
from kproxy.model import IPFamily  # noqa: E402
from kproxy.modes.ebpf.datapath import SockLB  # noqa: E402
from kproxy.modes.ebpf.layout import (  # noqa: E402
    Backend,
    ServiceKey,
    ServiceValue,
    backend_key,
)
from tests.kernel.bpf_cgroup import cgroup, server  # noqa: E402
from tests.kernel.bpf_programs import (  # noqa: E402
    HITS,
    SERVICES,
    backend_value,
    frame,
    service_key,
    tc_dnat,
)
from tests.kernel.netns import netns, sh  # noqa: E402


def machine_speed(rounds: int) -> None:
    """(a) instructions per second of the machine, and the kernel's ns per run."""
    e = EmulatedBpf()
    svc, hits = e.create_map(SERVICES), e.create_map(HITS)
    e.update(svc, service_key("10.96.0.10", 80, 6), backend_value("10.244.1.5", 8080))
    code = tc_dnat().assemble({"svc": svc, "hits": hits})
    pkt = frame("10.0.0.1", "10.96.0.10", 40000, 80, 6)
    machine = e.machine()
    insns, t0 = 0, time.perf_counter()
    for _ in range(rounds):
        insns += machine.run(code, SkBuff(packet=pkt)).insns
    dt = time.perf_counter() - t0
    per_run_us = dt / rounds * 1e6
    print(f"(a) machine: {insns / dt:,.0f} instructions/s ({insns // rounds} per run, "
          f"{per_run_us:.1f} us per run)")
    if not bpf_available():
        print("    kernel test run: skipped (needs root)")
        return
    k = LinuxBpf()
    ksvc, khits = k.create_map(SERVICES), k.create_map(HITS)
    try:
        k.update(ksvc, service_key("10.96.0.10", 80, 6), backend_value("10.244.1.5", 8080))
        prog = k.load_program(ProgramSpec(type=ProgType.SCHED_CLS, name="bench",
                                          code=tc_dnat().assemble({"svc": ksvc, "hits": khits})))
        ns_per_run = k.test_run(prog, pkt, repeat=100_000).duration_ns
        k.close(prog)
        print(f"    kernel BPF_PROG_TEST_RUN: {ns_per_run} ns per run; the machine is "
              f"{per_run_us * 1000 / max(ns_per_run, 1):,.0f}x slower")
    finally:
        k.close(ksvc)
        k.close(khits)


def _entries(services: int, endpoints: int) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]:
    svc_items: list[tuple[bytes, bytes]] = []
    be_items: list[tuple[bytes, bytes]] = []
    bid = 1
    for s in range(services):
        vip = f"10.{96 + s // 65536}.{s // 256 % 256}.{s % 256}"
        master = ServiceValue.master_entry(count=endpoints, qcount=0, rev_nat_index=s % 65535 + 1,
                                           flags=0, flags2=0)  # type: ignore[arg-type]
        svc_items.append((ServiceKey(address=vip, dport=80).pack(), master.pack()))
        for e in range(endpoints):
            svc_items.append((ServiceKey(address=vip, dport=80, backend_slot=e + 1).pack(),
                              ServiceValue(backend_id=bid, rev_nat_index=s % 65535 + 1).pack()))
            ip = f"10.{128 + bid // 65536}.{bid // 256 % 256}.{bid % 256}"
            be_items.append((backend_key(bid), Backend(address=ip, port=8080).pack()))
            bid += 1
    return svc_items, be_items


def _fill(k: BpfKernel, lb: SockLB, svc_items: list[tuple[bytes, bytes]],
          be_items: list[tuple[bytes, bytes]], *, batch: bool) -> tuple[float, int]:
    services, backends = lb.fd(IPFamily.IPv4, "services"), lb.fd(IPFamily.IPv4, "backends")
    calls = 0
    t0 = time.perf_counter()
    for fd, items in ((backends, be_items), (services, svc_items)):
        if batch:
            for i in range(0, len(items), 8192):
                calls += k.update_batch(fd, items[i:i + 8192])
        else:
            for key, value in items:
                k.update(fd, key, value)
                calls += 1
    return time.perf_counter() - t0, calls


def map_fill(services: int, endpoints: int) -> None:
    """(b) and (c)."""
    svc_items, be_items = _entries(services, endpoints)
    gc.collect()
    gc.freeze()  # the 210,000 prepared entries stay out of the collector's walks while timed
    size = 1 << max(16, (len(svc_items) - 1).bit_length())
    kernels: list[tuple[str, BpfKernel]] = [("emulated", EmulatedBpf())]
    if bpf_available():
        kernels.insert(0, ("linux", LinuxBpf()))
    for label, k in kernels:
        times = {}
        for batch in (True, False):
            lb = SockLB.load(k, (IPFamily.IPv4,), max_entries=size)
            try:
                times[batch] = _fill(k, lb, svc_items, be_items, batch=batch)
                if batch:
                    change_ops, change_s = _endpoint_change(k, lb, endpoints)
            finally:
                lb.close()
        (tb, cb), (te, ce) = times[True], times[False]
        print(f"(b) {label}: {len(svc_items) + len(be_items):,} entries for {services:,} Services x "
              f"{endpoints} endpoints: batched {tb:.2f} s in {cb} syscalls; one by one {te:.2f} s "
              f"in {ce:,} ({te / tb:.1f}x the batched time); target < 2 s: "
              f"{'met' if tb < 2 else 'missed'}")
        print(f"(c) {label}: one endpoint change: {change_ops} map operations, "
              f"{change_s * 1e3:.3f} ms; target < 1 ms: {'met' if change_s < 1e-3 else 'missed'}")


def _endpoint_change(k: BpfKernel, lb: SockLB, endpoints: int) -> tuple[int, float]:
    """Replace the first Service's last backend: one new backend, one slot rewritten, one delete."""
    services, backends = lb.fd(IPFamily.IPv4, "services"), lb.fd(IPFamily.IPv4, "backends")
    t0 = time.perf_counter()
    k.update(backends, backend_key(10_000_000), Backend(address="10.200.0.1", port=8080).pack())
    k.update(services, ServiceKey(address="10.96.0.0", dport=80, backend_slot=endpoints).pack(),
             ServiceValue(backend_id=10_000_000, rev_nat_index=1).pack())
    k.delete(backends, backend_key(endpoints))
    return 3, time.perf_counter() - t0


_LATENCY_CLIENT = r"""
import json, os, socket, sys, time
cg, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if cg:
    open(cg + "/cgroup.procs", "w").write(str(os.getpid()))
out = []
for _ in range(n):
    s = socket.socket()
    t0 = time.perf_counter()
    s.connect((host, port))
    out.append(time.perf_counter() - t0)
    s.close()
print(json.dumps(out))
"""


def _latency(ns: str, cg: str, host: str, port: int, n: int) -> float:
    proc = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c", _LATENCY_CLIENT,
                           cg, host, str(port), str(n)], capture_output=True, text=True, timeout=120,
                          check=True)
    return statistics.median(json.loads(proc.stdout))


def connect_latency(counts: list[int], connects: int) -> None:
    """(d) median connect latency through socket-LB per Service count."""
    if not bpf_available():
        print("(d) connect latency: skipped (needs root)")
        return
    k = LinuxBpf()
    with netns("bpfbench") as ns, server(ns, "127.0.0.1", 8080, "b"), cgroup("bpfbench") as cg:
        sh("ip", "-n", ns, "addr", "add", "10.96.0.1/32", "dev", "lo")
        base = _latency(ns, "", "127.0.0.1", 8080, connects)
        print(f"(d) baseline, nothing linked, straight to the backend: {base * 1e6:.1f} us")
        for n in counts:
            lb = SockLB.load(k, (IPFamily.IPv4,), max_entries=1 << max(16, (2 * n).bit_length()))
            try:
                services = lb.fd(IPFamily.IPv4, "services")
                items: list[tuple[bytes, bytes]] = []
                for s in range(n):
                    vip = "10.96.0.1" if s == n - 1 else f"10.97.{s // 256 % 256}.{s % 256}"
                    items.append((ServiceKey(address=vip, dport=80).pack(),
                                  ServiceValue.master_entry(count=1, qcount=0, rev_nat_index=s + 1,
                                                            flags=0, flags2=0).pack()))  # type: ignore[arg-type]
                    items.append((ServiceKey(address=vip, dport=80, backend_slot=1).pack(),
                                  ServiceValue(backend_id=1, rev_nat_index=s + 1).pack()))
                k.update_batch(lb.fd(IPFamily.IPv4, "backends"),
                               [(backend_key(1), Backend(address="127.0.0.1", port=8080).pack())])
                for i in range(0, len(items), 8192):
                    k.update_batch(services, items[i:i + 8192])
                lb.attach(cg)
                t = _latency(ns, cg, "10.96.0.1", 80, connects)
                print(f"    {n:>6,} Services through socket-LB: {t * 1e6:.1f} us "
                      f"({t / base:.2f}x the baseline)")
            finally:
                lb.close()


def main() -> None:
    """Parse the flags and run (a) to (d)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--latency-services", default="1000,10000,20000")
    p.add_argument("--connects", type=int, default=300)
    p.add_argument("--machine-runs", type=int, default=2000)
    p.add_argument("--parts", default="abcd", help="which of a, b+c, d to run (default all)")
    args = p.parse_args()
    if "a" in args.parts:
        machine_speed(args.machine_runs)
    if "b" in args.parts or "c" in args.parts:
        map_fill(args.services, args.endpoints)
    if "d" in args.parts:
        connect_latency([int(x) for x in args.latency_services.split(",") if x], args.connects)
    if os.geteuid() != 0:
        print("(run as root for the kernel figures)")


if __name__ == "__main__":
    main()
