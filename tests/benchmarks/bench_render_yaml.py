"""Benchmark: reading a large kubectl-style YAML manifest, and rendering it (issue 18 item 19).

Run it on its own (it is not part of ``make test``)::

    .venv/bin/python tests/benchmarks/bench_render_yaml.py [--services 20000]

Writes ``--services`` Services and their EndpointSlices (3 endpoints each) in the block style
``kubectl get -o yaml`` prints, then measures in one run, best of 3 rounds:

* YAML loading with PyYAML's ``CSafeLoader`` (the baseline) and with kproxy's loader
  (:mod:`kproxy.sources.yamlfast`), with the ratio;
* the whole ``kproxy render --proxy-mode iptables`` in a child process (wall time and peak RSS).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from kproxy.sources.yamlfast import load_all  # noqa: E402


def manifest(n: int) -> str:
    """``n`` Services with one EndpointSlice of three endpoints each, kubectl's block style."""
    out = []
    for i in range(n):
        ip = f"10.{96 + i // 65536}.{(i // 256) % 256}.{i % 256}"
        eps = "".join(
            f"- addresses:\n  - 10.244.{(i * 3 + j) // 256 % 256}.{(i * 3 + j) % 256}\n  conditions:\n"
            f"    ready: true\n    serving: true\n    terminating: false\n  nodeName: node-{j}\n"
            f"  targetRef:\n    kind: Pod\n    name: svc-{i}-pod-{j}\n    namespace: ns-{i % 50}\n"
            for j in range(3))
        out.append(
            f"---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{i}\n  namespace: ns-{i % 50}\n"
            f"  labels:\n    app: svc-{i}\n  resourceVersion: \"{1000 + i}\"\nspec:\n  clusterIP: {ip}\n"
            f"  clusterIPs:\n  - {ip}\n  internalTrafficPolicy: Cluster\n  ipFamilies:\n  - IPv4\n"
            f"  ipFamilyPolicy: SingleStack\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n"
            f"    targetPort: 8080\n  selector:\n    app: svc-{i}\n  sessionAffinity: None\n"
            "  type: ClusterIP\n"
            f"status:\n  loadBalancer: {{}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
            f"metadata:\n  name: svc-{i}-abcde\n  namespace: ns-{i % 50}\n  labels:\n"
            f"    kubernetes.io/service-name: svc-{i}\naddressType: IPv4\nendpoints:\n{eps}"
            "ports:\n- name: http\n  port: 8080\n  protocol: TCP\n")
    return "".join(out)


def best(fn: Any, rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=20_000)
    args = parser.parse_args()
    text = manifest(args.services)
    baseline = best(lambda: list(yaml.load_all(text, yaml.CSafeLoader)))
    fast = best(lambda: list(load_all(text)))
    print(f"YAML {len(text) / 1e6:.1f} MB, {2 * args.services} documents: CSafeLoader {baseline:.2f} s, "
          f"kproxy {fast:.2f} s ({baseline / fast:.2f}x faster)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.yaml"
        path.write_text(text)
        cmd = [sys.executable, "-m", "kproxy", "render", "--manifests", str(path), "--proxy-mode", "iptables",
               "--hostname-override", "node-0"]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
        wall = time.perf_counter() - start
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"kproxy render of {args.services} Services: {wall:.1f} s, peak RSS {rss_mb:.0f} MB")


if __name__ == "__main__":
    main()
