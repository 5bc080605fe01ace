"""Benchmark the nftables mode: kproxy's render against the kernel's ``nft -f`` of the same input.

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_nftables.py [--services 10000] [--endpoints 10]

In one run, for N Services x M endpoints (the Services of ``bench_iptables``):

a. kproxy's full render (``NftablesRenderer.render``, what a full sync writes);
b. a partial render after one endpoint of one Service changed (the snapshot reuses the other
   ports' objects, as the change tracker does), as :class:`NftablesMode` renders it (trusting its
   committed state), and again with the kernel's chains and sets passed in (kube-proxy's listing);
c. the kernel's own time to load the full render with ``nft -f`` in a network namespace made for
   the run and deleted after it (root only; skipped otherwise);
d. the emulator (``emulation.nftables``) on the same transaction: load time, new-flow packets
   per second (sample mode, tracing off, each flow a new conntrack entry to a random Service),
   and the rules and set/map lookups one traced packet meets for the first and the last Service
   (flat: the per-packet work does not grow with the number of Services).

Also the full render with the plans of an unchanged snapshot kept (kube-proxy's periodic full
resync). It prints each figure and the ratios against issue 12's targets: full render <= 0.1x
the kernel's load, partial render < 20 ms, emulator >= 50,000 new-flow packets/s. Each timing is
the best of ``--rounds`` (the kernel load and the emulator run once: a load at 10,000 Services
takes minutes, see the README's "nftables load time").
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
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from emulation.clock import ManualClock  # noqa: E402
from emulation.nftables import Netns, Ruleset, apply  # noqa: E402
from emulation.node import Interface, Node, Route  # noqa: E402
from emulation.packet import Packet  # noqa: E402
from kproxy.modes.nftables import NftablesConfig, NftablesRenderer  # noqa: E402
from tests.benchmarks.bench_iptables import NODE_IP, best, documents, snapshot, vip  # noqa: E402
from tests.unit.modes.nftables.dump import Dump  # noqa: E402


def kernel_load(text: str, rounds: int, timeout_s: float) -> float | None:
    """Best wall time of ``nft -f`` loading ``text`` in a fresh namespace, or None."""
    if os.geteuid() != 0 or shutil.which("nft") is None:
        print("(c) kernel load: skipped (needs root and nft)")
        return None
    times: list[float] = []
    with tempfile.NamedTemporaryFile("w", suffix=".nft") as f:
        f.write(text)
        f.flush()
        for r in range(rounds):
            ns = f"kproxy-bench-nft-{os.getpid()}-{r}"
            subprocess.run(["ip", "netns", "add", ns], check=True)
            try:
                t0 = time.perf_counter()
                try:
                    done = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", f.name],
                                          capture_output=True, text=True, timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    print(f"(c) kernel load: nft -f stopped after {timeout_s:.0f} s")
                    return None
                elapsed = time.perf_counter() - t0
                if done.returncode != 0:
                    print(f"(c) kernel load failed: {done.stderr.strip()[:300]}")
                    return None
                times.append(elapsed)
            finally:
                subprocess.run(["ip", "netns", "delete", ns], check=False)
    return min(times)


def emulator(text: str, services: int, packets: int) -> dict[str, float]:
    """Load ``text`` into the emulator; time ``packets`` new flows; trace the first and last Service."""
    node = Node(interfaces=(Interface(name="eth0", addresses=(f"{NODE_IP}/24",)),
                            Interface(name="cni0", addresses=("10.0.0.1/8",))),
                routes=(Route(destination="default", device="eth0", via="192.168.0.1"),))
    t0 = time.perf_counter()
    ns = Netns(node, ManualClock(), ruleset=apply(Ruleset(), text))
    load_s = time.perf_counter() - t0
    rng = random.Random(1)
    clients = [f"203.0.113.{k}" for k in range(1, 251)]
    t0 = time.perf_counter()
    for j in range(packets):
        p = Packet(src=clients[j // 60000 % 250], dst=vip(rng.randrange(services)), sport=1024 + j % 60000,
                   dport=80, in_interface="eth0")
        if not ns.send(p, rng).dnat:
            raise SystemExit(f"emulator: packet to {p.dst}:80 was not translated")
        ns.clock.advance(0.001)  # type: ignore[attr-defined]
    pps = packets / (time.perf_counter() - t0)
    out: dict[str, float] = {"load_s": load_s, "pps": pps}
    for s, name in ((0, "first"), (services - 1, "last")):
        traced = ns.send(Packet(src="198.51.100.9", dst=vip(s), sport=7, dport=80, in_interface="eth0"), rng,
                         trace=True)
        lookups = sum(1 for step in traced.trace if step.result.startswith("lookup"))
        out[f"{name}_rules"], out[f"{name}_lookups"] = float(len(traced.trace) - lookups), float(lookups)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds per figure (best is kept)")
    ap.add_argument("--kernel-timeout", type=float, default=900.0, help="seconds one nft -f may take")
    ap.add_argument("--packets", type=int, default=20000, help="emulator new flows timed")
    args = ap.parse_args()
    n, m = args.services, args.endpoints
    print(f"{n} Services x {m} endpoints, ClusterIP TCP, node {NODE_IP}")
    snap = snapshot(documents(n, m))
    config = NftablesConfig(node_ips=(NODE_IP,), cluster_cidr=("10.0.0.0/8",),
                            service_cidrs=("172.30.0.0/16",))

    def full_render() -> tuple[NftablesRenderer, object]:
        renderer = NftablesRenderer(config)
        return renderer, renderer.render(snap, full=True)

    full_s, (renderer, full) = best(args.rounds, full_render)
    print(f"(a) full render: {full_s * 1000:.0f} ms ({full.operations} operations)")  # type: ignore[attr-defined]
    renderer.commit(full)  # type: ignore[arg-type]
    warm_s, warm = best(args.rounds, lambda: renderer.render(snap, full=True))
    print(f"    full render again with the port plans kept (periodic full resync): {warm_s * 1000:.0f} ms")
    renderer.commit(warm)
    state = Dump()
    state.apply(full.text)  # type: ignore[attr-defined]
    chains, sets = frozenset(state.chains), frozenset(state.sets)
    moved = snapshot(documents(n, m, moved=7), revision=2)
    key = next(k for k in moved.ports if moved.ports[k] != snap.ports.get(k))
    ports = dict(snap.ports)
    ports[key] = moved.ports[key]
    moved = replace(snap, revision=2, ports=MappingProxyType(ports), changed=frozenset({key[1]}))
    partial_s, partial = best(args.rounds, lambda: renderer.render(moved, now_s=1.0))
    print(f"(b) partial render after one endpoint change, as NftablesMode renders it (no listing): "
          f"{partial_s * 1000:.1f} ms ({partial.written_ports} port(s) rewritten, "
          f"{partial.operations} operations)")
    listed_s, _ = best(args.rounds, lambda: renderer.render(moved, existing_chains=chains, existing_sets=sets,
                                                            now_s=1.0))
    print(f"    the same with the kernel's {len(chains):,} chains passed in (kube-proxy's listing): "
          f"{listed_s * 1000:.1f} ms")
    kernel_s = kernel_load(full.text, 1, args.kernel_timeout)  # type: ignore[attr-defined]
    if kernel_s is not None:
        print(f"(c) kernel load (nft -f in a new netns): {kernel_s * 1000:.0f} ms")
    emu = emulator(full.text, n, args.packets)  # type: ignore[attr-defined]
    print(f"(d) emulator: load {emu['load_s']:.1f} s; {emu['pps']:,.0f} new-flow packets/s; a new flow meets "
          f"{emu['first_rules']:.0f} rules + {emu['first_lookups']:.0f} lookups (first Service), "
          f"{emu['last_rules']:.0f} + {emu['last_lookups']:.0f} (last Service)")
    print("targets:")
    if kernel_s is not None:
        ratio = full_s / kernel_s
        verdict = "ok" if ratio <= 0.1 else "MISSED"
        print(f"    full render / kernel load = {ratio:.3f} (target <= 0.1): {verdict}")
    print(f"    partial render = {partial_s * 1000:.1f} ms (target < 20 ms): "
          f"{'ok' if partial_s < 0.020 else 'MISSED'}")
    print(f"    emulator = {emu['pps']:,.0f} new-flow packets/s, {emu['pps'] / 50000:.2f}x the target "
          f"(>= 50,000): {'ok' if emu['pps'] >= 50000 else 'MISSED'}")
    flat = emu["last_rules"] + emu["last_lookups"] == emu["first_rules"] + emu["first_lookups"]
    print(f"    per-packet work first vs last Service: {'flat: ok' if flat else 'GROWS: MISSED'}")


if __name__ == "__main__":
    main()
