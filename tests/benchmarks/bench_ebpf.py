"""Benchmark the ebpf mode's map rendering: a full fill and a one-endpoint partial sync.

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_ebpf.py [--services 10000] [--endpoints 10]

With N ClusterIP Services of E endpoints each (one NodePort Service in ten, on a node with
two addresses, so that surrogates and expansions are in the fill) it measures:

* ``full fill``: :meth:`MapState.sync` of the first snapshot into an empty state plus the
  bytes of every entry (:meth:`EbpfMaps.entries`), what loading empty maps needs;
* ``one endpoint``: the sync after one endpoint is added to one Service: the map operations
  it returns, and its time, beside the baseline measured in the same run, a full re-render of
  the changed snapshot into a fresh state (what a mode without partial syncs would redo).

The map operations of the partial sync are also counted per changed endpoint.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kproxy.model import NodeConfig, build_snapshot, parse_objects
from kproxy.model.objects import EndpointSlice, Service
from kproxy.modes.ebpf import EbpfConfig, MapState
from kproxy.sync.tracker import changed_names
from tests.unit.modes.kube import endpoint_slice, ep, port, service


def _docs(n: int, e: int, extra: int = 0) -> list[dict[str, object]]:
    docs: list[dict[str, object]] = []
    for i in range(n):
        spec: dict[str, object] = {"type": "NodePort"} if i % 10 == 0 else {}
        ports = [port("p", 80, nodePort=30000 + i // 10)] if i % 10 == 0 else [port("p", 80)]
        docs.append(service("ns", f"s{i}", f"10.{96 + i // 65536}.{i // 256 % 256}.{i % 256}", ports, **spec))
        eps = [ep(f"10.{128 + (i * e + j) // 65536}.{(i * e + j) // 256 % 256}.{(i * e + j) % 256}")
               for j in range(e)]
        if i == 0:
            eps += [ep(f"10.250.0.{j + 1}") for j in range(extra)]
        docs.append(endpoint_slice("ns", f"s{i}", eps, [("p", 8080, "TCP")]))
    return docs


def _snapshot(docs: list[dict[str, object]], revision: int):  # type: ignore[no-untyped-def]
    result = parse_objects({"apiVersion": "v1", "kind": "List", "items": docs})
    services = [o for o in result.objects if isinstance(o, Service)]
    slices = [o for o in result.objects if isinstance(o, EndpointSlice)]
    return build_snapshot(services, slices, NodeConfig(hostname="node"), revision=revision)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    args = parser.parse_args()
    config = EbpfConfig(node_ips=("192.168.1.10", "192.168.1.11"))
    first = _snapshot(_docs(args.services, args.endpoints), 1)
    second = _snapshot(_docs(args.services, args.endpoints, extra=1), 2)
    second = replace(second, changed=changed_names(first.ports, second.ports))
    assert len(second.changed) == 1, second.changed
    # The snapshots' objects are long-lived: keep the cyclic GC from rescanning them during the
    # timed syncs (a daemon holding its state does the same with gc.freeze after startup).
    gc.collect()
    gc.freeze()

    state = MapState(config=config)
    t0, c0 = time.perf_counter(), time.process_time()
    fill_ops = state.sync(first)
    entries = state.maps().entries()
    full, full_cpu = time.perf_counter() - t0, time.process_time() - c0
    total = sum(len(v) for v in entries.values())
    print(f"full fill: {args.services} Services x {args.endpoints} endpoints -> {total} entries "
          f"({len(fill_ops)} ops) in {full:.3f} s ({full_cpu:.3f} s of CPU; wall time counts the "
          f"other processes of a shared machine)")

    t0 = time.perf_counter()
    ops = state.sync(second)
    partial = time.perf_counter() - t0
    changed = state.maps().entries()
    for op in ops:  # the operations turn the old contents into the new ones
        if op.value is None:
            del entries[op.map][op.key]
        else:
            entries.setdefault(op.map, {})[op.key] = op.value
    assert entries == changed
    # The same change back and forth, 20 times: the median and best of the partial syncs.
    times: list[float] = []
    back = replace(first, changed=second.changed)
    for k in range(20):
        snap = replace(back if k % 2 == 0 else second, revision=3 + k)
        t0 = time.perf_counter()
        state.sync(snap)
        times.append(time.perf_counter() - t0)
    times.sort()
    t0, c0 = time.perf_counter(), time.process_time()
    fresh = MapState(config=config)
    fresh.sync(second)
    fresh.maps().entries()
    baseline, baseline_cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"one endpoint added: {len(ops)} map ops ({len(ops)} per changed endpoint) in "
          f"{partial * 1e3:.3f} ms (20 more syncs of it: median {times[10] * 1e3:.3f} ms, best "
          f"{times[0] * 1e3:.3f} ms); full re-render baseline {baseline:.3f} s ({baseline_cpu:.3f} s CPU); "
          f"ratio median partial/full = {times[10] / baseline:.6f}")
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for op in ops:
        print(f"  {op.kind.value:6} {op.map}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
