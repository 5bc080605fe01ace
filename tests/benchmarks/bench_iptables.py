"""Benchmark the iptables mode: kproxy's render against the kernel's apply, and the emulator.

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_iptables.py [--services 10000] [--endpoints 10]

In one run, for N Services x M endpoints (ClusterIP, TCP port 80, endpoints spread over nodes):

a. kproxy's full render (``IptablesRenderer.render``, what a full sync writes);
b. a partial render after one endpoint of one Service changed;
c. the kernel's own time to apply the full render with ``iptables-restore --noflush`` in a
   network namespace made for the run and deleted after it (root only; skipped otherwise),
   and with ``iptables-legacy-restore`` too when the default is the nf_tables backend (whose
   restore of 10,000 Services takes far longer than a minute and is stopped at
   ``--kernel-timeout``);
d. the emulator (``emulation.netfilter``) on the same rules plus kube-proxy's jump rules: load
   time; new-flow packets per second in sample mode with tracing off, for the first flows
   after the load and in the steady state (after ``--warmup`` more flows, when the flow cache
   holds most paths); enumerate mode with and without the flow cache; one traced packet.

It prints each figure and the ratios against the issue's targets: full render <= 0.1x the
kernel's apply, partial render < 20 ms, emulator >= 50,000 new-flow packets/s. Each timing is
the best of ``--rounds`` (other processes only ever make a figure worse); the whole run takes
about three minutes at the default size.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from emulation.clock import ManualClock  # noqa: E402
from emulation.netfilter import Netns, Ruleset, apply_restore  # noqa: E402
from emulation.node import Interface, Node, Route  # noqa: E402
from emulation.packet import Packet  # noqa: E402
from kproxy.model import (  # noqa: E402
    EndpointSlice,
    NodeConfig,
    Service,
    Snapshot,
    build_snapshot,
    parse_objects,
)
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer  # noqa: E402

NODE = "node-0"
NODE_IP = "192.168.0.2"
CLIENT = "203.0.113.2"
T = TypeVar("T")

#: kube-proxy's jump rules into its chains (it installs them before each full restore).
JUMPS = """*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
COMMIT
"""


def vip(s: int) -> str:
    """The ClusterIP of Service ``s``."""
    return f"172.30.{s // 250}.{s % 250 + 1}"


def endpoint_ip(s: int, e: int, endpoints: int) -> str:
    """The address of endpoint ``e`` of Service ``s``."""
    n = s * endpoints + e
    return f"10.{1 + n // 62500}.{n // 250 % 250}.{n % 250 + 1}"


def documents(services: int, endpoints: int, *, moved: int | None = None) -> list[dict[str, Any]]:
    """Services and EndpointSlices as API dicts; ``moved`` gives Service 0's first endpoint a new IP."""
    docs: list[dict[str, Any]] = []
    for s in range(services):
        name = f"svc{s}"
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"namespace": "bench", "name": name},
                "spec": {"clusterIP": vip(s), "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
            }
        )
        eps = []
        for e in range(endpoints):
            ip = endpoint_ip(s, e, endpoints)
            if s == 0 and e == 0 and moved is not None:
                ip = f"10.200.0.{moved}"
            eps.append({"addresses": [ip], "nodeName": f"node-{e % 50}", "conditions": {"ready": True}})
        docs.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "namespace": "bench",
                    "name": f"{name}-1",
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "endpoints": eps,
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            }
        )
    return docs


def snapshot(docs: list[dict[str, Any]], revision: int = 1) -> Snapshot:
    """Parse the documents and build the node's Snapshot."""
    result = parse_objects({"apiVersion": "v1", "kind": "List", "items": docs})
    if result.problems:
        raise SystemExit(f"bad benchmark objects: {result.problems[:3]}")
    services = [o for o in result.objects if isinstance(o, Service)]
    slices = [o for o in result.objects if isinstance(o, EndpointSlice)]
    return build_snapshot(services, slices, NodeConfig(hostname=NODE), revision=revision)


def best(rounds: int, fn: Callable[[], T]) -> tuple[float, T]:
    """The shortest of ``rounds`` timings of ``fn()`` in seconds, and its last result."""
    times: list[float] = []
    result: T
    for _ in range(rounds):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def kernel_apply(text: str, rounds: int, tool: str, timeout_s: float) -> float | None:
    """Best wall time of ``tool --noflush`` applying ``text`` in a fresh namespace, or None.

    Each round gets its own namespace (``kproxy-bench-PID-N``), deleted afterwards. A round
    slower than ``timeout_s`` is stopped and reported; one slower than 10 s is not repeated.
    """
    if os.geteuid() != 0:
        print(f"(c) kernel apply ({tool}): skipped (needs root to create a network namespace)")
        return None
    missing = [t for t in ("ip", tool) if shutil.which(t) is None]
    if missing:
        print(f"(c) kernel apply ({tool}): skipped ({', '.join(missing)} not on PATH)")
        return None
    times: list[float] = []
    with tempfile.NamedTemporaryFile("w", suffix=".rules") as f:
        f.write(text)
        f.flush()
        for r in range(rounds):
            ns = f"kproxy-bench-{os.getpid()}-{r}"
            subprocess.run(["ip", "netns", "add", ns], check=True)
            try:
                with open(f.name) as stdin:
                    t0 = time.perf_counter()
                    try:
                        done = subprocess.run(
                            ["ip", "netns", "exec", ns, tool, "--noflush"],
                            stdin=stdin,
                            capture_output=True,
                            text=True,
                            timeout=timeout_s,
                        )
                    except subprocess.TimeoutExpired:
                        print(f"(c) kernel apply ({tool}): stopped after {timeout_s:.0f} s")
                        return None
                    elapsed = time.perf_counter() - t0
                if done.returncode != 0:
                    print(f"(c) kernel apply ({tool}): failed: {done.stderr.strip()[:300]}")
                    return None
                times.append(elapsed)
            finally:
                subprocess.run(["ip", "netns", "delete", ns], check=False)
            if elapsed > 10:
                break
    return min(times)


def _new_flows(ns: Netns, rng: random.Random, services: int, count: int, first: int) -> float:
    """Send ``count`` new flows (numbered from ``first``) to random Services; return the seconds.

    Flow ``j`` comes from client ``203.0.113.(j // 60000 % 250 + 1)``, source port
    ``1024 + j % 60000``, so no two flows share a conntrack tuple. The emulated clock advances
    1 ms a flow (a node taking 1,000 new flows a second), so conntrack holds the last 120 s of
    unreplied flows, about 120,000 entries, rather than every flow since the load.
    """
    clock = ns.clock
    assert isinstance(clock, ManualClock)
    vips = [vip(s) for s in range(services)]
    clients = [f"203.0.113.{k}" for k in range(1, 251)]
    t0 = time.perf_counter()
    for j in range(first, first + count):
        p = Packet(
            src=clients[j // 60000 % 250],
            dst=vips[rng.randrange(services)],
            sport=1024 + j % 60000,
            dport=80,
            in_interface="eth0",
        )
        out = ns.send(p, rng)
        if not out.dnat:
            raise SystemExit(f"emulator: packet to {p.dst}:80 was not translated ({out.reason})")
        clock.advance(0.001)
    return time.perf_counter() - t0


def emulator(
    text: str, services: int, endpoints: int, packets: int, warmup: int, steady: int, rounds: int
) -> dict[str, float]:
    """Load the rules into the emulator and time packets in each mode (tracing off, then on).

    Sample mode is timed twice: ``packets`` first flows right after the load (chains are
    compiled and paths recorded in the flow cache as they are first met), and, after
    ``warmup`` more, the best of ``rounds`` windows of ``steady`` new flows each, when the
    flow cache has met most (Service, endpoint) paths; the share of those windows' flows whose
    path had to be walked and recorded is reported beside it.
    """
    node = Node(
        interfaces=(
            Interface(name="eth0", addresses=(f"{NODE_IP}/24",)),
            Interface(name="cni0", addresses=("10.0.0.1/8",)),
        ),
        routes=(Route(destination="default", device="eth0", via="192.168.0.1"),),
    )
    t0 = time.perf_counter()
    rs = apply_restore(Ruleset(), text, noflush=True)
    rs = apply_restore(rs, JUMPS, noflush=True)
    load_s = time.perf_counter() - t0
    ns = Netns(node, ManualClock(), ruleset=rs)
    rng = random.Random(1)
    first_s = _new_flows(ns, rng, services, packets, 0)
    _new_flows(ns, rng, services, warmup, packets)
    cache = ns.flow_cache
    recorded = cache.recorded if cache is not None else 0
    steady_s = min(
        _new_flows(ns, rng, services, steady, packets + warmup + r * steady) for r in range(rounds)
    )
    cache = ns.flow_cache
    walked = ((cache.recorded if cache is not None else 0) - recorded) / rounds
    m = max(packets // 40, 50)
    t0 = time.perf_counter()
    outcomes = 0
    for i in range(m):
        s = rng.randrange(services)
        p = Packet(src=CLIENT, dst=vip(s), sport=i + 1, dport=80, in_interface="eth0")
        outcomes += len(ns.enumerate(p))
    enum_s = time.perf_counter() - t0
    uncached = Netns(node, ManualClock(), ruleset=rs)
    uncached.cache_flows = False
    t0 = time.perf_counter()
    for i in range(m):
        s = rng.randrange(services)
        p = Packet(src=CLIENT, dst=vip(s), sport=i + 1, dport=80, in_interface="eth0")
        outcomes += len(uncached.enumerate(p))
    enum_walk_s = time.perf_counter() - t0
    last = vip(services - 1)
    p = Packet(src=CLIENT, dst=last, sport=9, dport=80, in_interface="eth0")
    t0 = time.perf_counter()
    traced = ns.send(p, rng, trace=True)
    trace_s = time.perf_counter() - t0
    return {
        "load_s": load_s,
        "rules": float(len(rs.rules())),
        "first_pps": packets / first_s,
        "steady_pps": steady / steady_s,
        "steady_walked": walked / steady,
        "segments": float(cache.segments if cache is not None else 0),
        "enumerate_pps": m / enum_s,
        "enumerate_walk_pps": m / enum_walk_s,
        "outcomes_per_packet": outcomes / (2 * m),
        "trace_s": trace_s,
        "trace_steps": float(len(traced.trace)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds per figure (best is kept)")
    ap.add_argument("--packets", type=int, default=20000, help="new flows timed right after the load")
    ap.add_argument("--warmup", type=int, default=600000, help="new flows sent before the steady timing")
    ap.add_argument("--steady", type=int, default=100000, help="new flows timed in the steady state")
    ap.add_argument(
        "--kernel-timeout",
        type=float,
        default=60.0,
        help="seconds one iptables-restore may take (the nf_tables backend grows faster than linearly)",
    )
    args = ap.parse_args()
    n, m = args.services, args.endpoints
    started = time.perf_counter()
    print(f"{n} Services x {m} endpoints, ClusterIP TCP, node {NODE} ({NODE_IP})")

    snap = snapshot(documents(n, m))
    config = IptablesConfig(node_ips=(NODE_IP,), cluster_cidr=("10.0.0.0/8",))

    def full_render() -> tuple[IptablesRenderer, Any]:
        renderer = IptablesRenderer(config)
        return renderer, renderer.render(snap, full=True)

    full_s, (renderer, full) = best(args.rounds, full_render)
    lines = full.text.count("\n")
    print(f"(a) full render: {full_s * 1000:.0f} ms ({lines} lines, {full.nat_rules} nat rules)")

    renderer.commit(full)
    moved = snapshot(documents(n, m, moved=7), revision=2)
    changed = frozenset(k[1] for k in moved.ports if moved.ports[k] != snap.ports.get(k))
    moved = replace(moved, changed=changed)
    partial_s, partial = best(args.rounds, lambda: renderer.render(moved))
    print(
        f"(b) partial render after one endpoint change: {partial_s * 1000:.1f} ms "
        f"({partial.written_ports} port(s) rewritten, {partial.text.count(chr(10))} lines)"
    )

    kernel: dict[str, float] = {}
    tools = ["iptables-restore"]
    legacy = shutil.which("iptables-legacy-restore")
    if legacy and os.path.realpath(legacy) != os.path.realpath(shutil.which("iptables-restore") or ""):
        tools.append("iptables-legacy-restore")
    for tool in tools:
        t = kernel_apply(full.text, args.rounds, tool, args.kernel_timeout)
        if t is not None:
            kernel[tool] = t
            print(f"(c) kernel apply ({tool} --noflush in a new netns): {t * 1000:.0f} ms")

    emu = emulator(full.text, n, m, args.packets, args.warmup, args.steady, args.rounds)
    print(f"(d) emulator load: {emu['load_s']:.2f} s ({emu['rules']:.0f} rules)")
    print(
        f"    sample, tracing off, first {args.packets:,} flows after the load: "
        f"{emu['first_pps']:,.0f} new-flow packets/s"
    )
    print(
        f"    sample, tracing off, steady state (best of {args.rounds} x {args.steady:,} flows "
        f"after {args.warmup:,} more): "
        f"{emu['steady_pps']:,.0f} new-flow packets/s ({emu['steady_walked']:.1%} walked and recorded, "
        f"{emu['segments']:,.0f} cached segments)"
    )
    print(
        f"    enumerate, tracing off: {emu['enumerate_pps']:,.0f} packets/s with the flow cache, "
        f"{emu['enumerate_walk_pps']:,.0f} without ({emu['outcomes_per_packet']:.1f} outcomes each)"
    )
    print(f"    one traced packet: {emu['trace_s'] * 1000:.1f} ms ({emu['trace_steps']:.0f} steps)")

    print("targets:")
    for tool, kernel_s in kernel.items():
        ratio = full_s / kernel_s
        verdict = "ok" if ratio <= 0.1 else "MISSED"
        print(f"    full render / kernel apply ({tool}) = {ratio:.3f} (target <= 0.1): {verdict}")
    if not kernel:
        print("    full render / kernel apply: no kernel figure")
    print(
        f"    partial render = {partial_s * 1000:.1f} ms (target < 20 ms): "
        f"{'ok' if partial_s < 0.020 else 'MISSED'}"
    )
    for label, key in (("steady state", "steady_pps"), ("first flows", "first_pps")):
        print(
            f"    emulator sample, {label} = {emu[key]:,.0f} packets/s (target >= 50,000): "
            f"{'ok' if emu[key] >= 50000 else 'MISSED'}"
        )
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
