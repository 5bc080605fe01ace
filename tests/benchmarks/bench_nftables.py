"""Benchmark the nftables mode: kproxy's render against the kernel's ``nft -f`` of the same input.

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_nftables.py [--services 10000] [--endpoints 10]

In one run, for N Services x M endpoints (the Services of ``bench_iptables``):

a. kproxy's full render (``NftablesRenderer.render``, what a full sync writes);
b. a partial render after one endpoint of one Service changed (the snapshot reuses the other
   ports' objects, as the change tracker does), as :class:`NftablesMode` renders it (trusting its
   committed state), and again with the kernel's chains and sets passed in (kube-proxy's listing);
c. the kernel's own time to load the full render with ``nft -f`` in a network namespace made for
   the run and deleted after it (root only; skipped otherwise).

It prints each figure and the ratios against issue 12's targets: full render <= 0.1x the
kernel's load, partial render < 20 ms. Each timing is the best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import os
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

from kproxy.modes.nftables import NftablesConfig, NftablesRenderer  # noqa: E402
from tests.benchmarks.bench_iptables import NODE_IP, best, documents, snapshot  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds per figure (best is kept)")
    ap.add_argument("--kernel-timeout", type=float, default=120.0, help="seconds one nft -f may take")
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
    kernel_s = kernel_load(full.text, args.rounds, args.kernel_timeout)  # type: ignore[attr-defined]
    if kernel_s is not None:
        print(f"(c) kernel load (nft -f in a new netns): {kernel_s * 1000:.0f} ms")
    print("targets:")
    if kernel_s is not None:
        ratio = full_s / kernel_s
        verdict = "ok" if ratio <= 0.1 else "MISSED"
        print(f"    full render / kernel load = {ratio:.3f} (target <= 0.1): {verdict}")
    print(f"    partial render = {partial_s * 1000:.1f} ms (target < 20 ms): "
          f"{'ok' if partial_s < 0.020 else 'MISSED'}")


if __name__ == "__main__":
    main()
