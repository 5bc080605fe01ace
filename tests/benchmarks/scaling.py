"""The scaling experiment: iptables against nftables, in the real kernel and in the emulator.

Run it as root on its own (it is not part of ``make test``)::

    make scaling                                  # 1,000 / 5,000 / 10,000 / 20,000 Services
    make scaling SIZES=500,1000,2000              # a quick run
    .venv/bin/python tests/benchmarks/scaling.py --sizes 1000,5000 --out docs/scaling

For each size N (Services of ``bench_iptables``: ClusterIP TCP port 80, ``--endpoints`` each) and
each mode, in a network namespace made for the measurement and deleted after it:

- **load**: the wall time of the kernel's own load of kproxy's full render
  (``iptables-legacy-restore --noflush`` of the iptables render and kube-proxy's jump rules,
  or ``iptables-restore`` when there is no legacy tool; ``nft -f`` of the nftables transaction);
- **update**: the wall time of loading the partial render after one endpoint of Service 0
  moved (what a sync writes), i.e. until the change is in the kernel;
- **connect latency**: real TCP connects from inside the namespace to the ClusterIP of the
  first and of the last Service (``--connects`` each, alternating, every one a new conntrack
  entry so the first packet walks the rules); both Services' endpoints are local addresses
  with a listener. The extra latency of the last Service over the first, at p50 and p99, is
  what the rules cost a new connection;
- **emulator**: the same render loaded into the emulator (``emulation.netfilter`` or
  ``emulation.nftables``); one traced packet to the first and one to the last Service: how many
  rules and set/map lookups it meets (linear in N for iptables, flat for nftables).

It writes ``OUT.csv`` (one row per mode and size; p50 and p99) and ``OUT.png`` (four panels; the
latency panel shows p50, the p99 on a shared machine being noise); ``--chart-only`` redraws the
PNG from the CSV. A step that
takes longer than ``--timeout`` seconds is stopped and left empty in the CSV.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from emulation.clock import ManualClock  # noqa: E402
from emulation.netfilter import Netns as IptNetns  # noqa: E402
from emulation.netfilter import Ruleset as IptRuleset  # noqa: E402
from emulation.netfilter import apply_restore  # noqa: E402
from emulation.nftables import Netns as NftNetns  # noqa: E402
from emulation.nftables import Ruleset as NftRuleset  # noqa: E402
from emulation.nftables import apply as nft_apply  # noqa: E402
from emulation.node import Interface, Node, Route  # noqa: E402
from emulation.packet import Packet  # noqa: E402
from kproxy.model import Snapshot  # noqa: E402
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer  # noqa: E402
from kproxy.modes.nftables import NftablesConfig, NftablesRenderer  # noqa: E402
from tests.benchmarks.bench_iptables import JUMPS, NODE_IP, documents, endpoint_ip, snapshot, vip  # noqa: E402

MODES = ("iptables", "nftables")
PORT = 8080
CLIENT = "203.0.113.2"

#: Runs in the namespace: accept and close connections on PORT until killed.
_LISTENER = f"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {PORT}))
s.listen(1024)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.close()
"""

#: Runs in the namespace: COUNT connects to each of the HOSTs (port 80), alternating; prints the
#: microseconds of each successful connect() as "HOST US" lines.
_CLIENT = """
import socket, sys, time
count, hosts = int(sys.argv[1]), sys.argv[2:]
for i in range(count + 10):
    for host in hosts:
        s = socket.socket()
        s.settimeout(1.0)
        t0 = time.perf_counter()
        try:
            s.connect((host, 80))
            if i >= 10:  # the first rounds warm caches and the interpreter up
                print(host, (time.perf_counter() - t0) * 1e6)
        except OSError:
            pass
        s.close()
"""


@dataclass
class Row:
    """One mode at one size; None where a step failed or was stopped."""

    mode: str
    services: int
    load_s: float | None = None
    update_s: float | None = None
    first_us: list[float] = field(default_factory=list)
    last_us: list[float] = field(default_factory=list)
    emu_first: tuple[int, int] | None = None  # (rules, lookups) of the first Service's packet
    emu_last: tuple[int, int] | None = None

    def csv(self) -> dict[str, Any]:
        def pct(xs: list[float], q: float) -> float | None:
            return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else None

        def diff(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else a - b

        f50, f99 = pct(self.first_us, 0.5), pct(self.first_us, 0.99)
        l50, l99 = pct(self.last_us, 0.5), pct(self.last_us, 0.99)
        return {
            "mode": self.mode, "services": self.services, "load_s": self.load_s, "update_s": self.update_s,
            "first_p50_us": f50, "first_p99_us": f99, "last_p50_us": l50, "last_p99_us": l99,
            "extra_p50_us": diff(l50, f50), "extra_p99_us": diff(l99, f99), "connects": len(self.last_us),
            "emu_rules_first": self.emu_first[0] if self.emu_first else None,
            "emu_lookups_first": self.emu_first[1] if self.emu_first else None,
            "emu_rules_last": self.emu_last[0] if self.emu_last else None,
            "emu_lookups_last": self.emu_last[1] if self.emu_last else None,
        }


def _sh(*args: str, timeout: float = 60.0, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout, check=True)


def _timed_load(ns: str, mode: str, text: str, timeout: float) -> float | None:
    """Seconds the kernel took to load ``text`` (a file, as kube-proxy pipes it), or None."""
    with tempfile.NamedTemporaryFile("w", suffix=".rules") as f:
        f.write(text)
        f.flush()
        if mode == "nftables":
            argv = ["ip", "netns", "exec", ns, "nft", "-f", f.name]
        else:
            legacy = shutil.which("iptables-legacy-restore")
            tool = "iptables-legacy-restore" if legacy else "iptables-restore"
            argv = ["ip", "netns", "exec", ns, tool, "--noflush", f.name]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"    {mode}: load stopped after {timeout:.0f} s", flush=True)
            return None
        elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        print(f"    {mode}: load failed: {done.stderr.strip()[:300]}", flush=True)
        return None
    return elapsed


def _renders(mode: str, snap: Snapshot, moved: Snapshot) -> tuple[str, str]:
    """The full render of ``snap`` and the partial render of ``moved`` after it."""
    if mode == "nftables":
        config = NftablesConfig(node_ips=(NODE_IP,), cluster_cidr=("10.0.0.0/8",))
        nft = NftablesRenderer(config)
        full = nft.render(snap, full=True)
        nft.commit(full)
        return full.text, nft.render(moved, now_s=1.0).text
    ipt = IptablesRenderer(IptablesConfig(node_ips=(NODE_IP,), cluster_cidr=("10.0.0.0/8",)))
    full_ipt = ipt.render(snap, full=True)
    ipt.commit(full_ipt)
    return full_ipt.text + JUMPS, ipt.render(moved).text


def _latency(ns: str, n: int, endpoints: int, connects: int, row: Row) -> None:
    """Connect to the first and last Service from inside ``ns`` (their endpoints made local)."""
    _sh("ip", "-n", ns, "addr", "add", f"{NODE_IP}/32", "dev", "lo")
    _sh("ip", "-n", ns, "route", "add", "172.30.0.0/16", "dev", "lo", "src", NODE_IP)
    for s in (0, n - 1):
        for e in range(endpoints):
            _sh("ip", "-n", ns, "addr", "add", f"{endpoint_ip(s, e, endpoints)}/32", "dev", "lo")
    listener = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _LISTENER],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        listener.stdout.readline()
        first, last = vip(0), vip(n - 1)
        out = _sh("ip", "netns", "exec", ns, sys.executable, "-c", _CLIENT, str(connects), first, last,
                  timeout=60 + connects * 4.0).stdout
        for line in out.splitlines():
            host, us = line.split()
            (row.first_us if host == first else row.last_us).append(float(us))
    finally:
        listener.kill()
        listener.wait()


def _node() -> Node:
    return Node(interfaces=(Interface(name="eth0", addresses=(f"{NODE_IP}/24",)),
                            Interface(name="cni0", addresses=("10.0.0.1/8",))),
                routes=(Route(destination="default", device="eth0", via="192.168.0.1"),))


def _emulated(mode: str, text: str, n: int, row: Row) -> None:
    """Rules and lookups a new flow to the first and to the last Service meets in the emulator."""
    ns: IptNetns | NftNetns
    if mode == "nftables":
        ns = NftNetns(_node(), ManualClock(), ruleset=nft_apply(NftRuleset(), text))
    else:
        ns = IptNetns(_node(), ManualClock(), ruleset=apply_restore(IptRuleset(), text, noflush=True))
    rng = random.Random(1)
    for s, slot in ((0, "emu_first"), (n - 1, "emu_last")):
        out = ns.send(Packet(src=CLIENT, dst=vip(s), sport=1000 + s % 30000, dport=80, in_interface="eth0"),
                      rng, trace=True)
        if not out.dnat:
            raise SystemExit(f"emulator ({mode}): {vip(s)}:80 was not translated ({out.reason})")
        lookups = sum(1 for step in out.trace if step.result.startswith("lookup"))
        setattr(row, slot, (len(out.trace) - lookups, lookups))


def measure(mode: str, n: int, args: argparse.Namespace) -> Row:
    """Every figure of one mode at one size (see the module docstring)."""
    row = Row(mode=mode, services=n)
    snap = snapshot(documents(n, args.endpoints))
    moved_src = snapshot(documents(n, args.endpoints, moved=7), revision=2)
    key = next(k for k in moved_src.ports if moved_src.ports[k] != snap.ports.get(k))
    ports = dict(snap.ports)
    ports[key] = moved_src.ports[key]
    moved = replace(snap, revision=2, ports=MappingProxyType(ports), changed=frozenset({key[1]}))
    full, partial = _renders(mode, snap, moved)
    ns = f"kproxy-scaling-{mode}-{os.getpid()}"
    _sh("ip", "netns", "add", ns)
    try:
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        row.load_s = _timed_load(ns, mode, full, args.timeout)
        if row.load_s is not None:
            _latency(ns, n, args.endpoints, args.connects, row)
            row.update_s = _timed_load(ns, mode, partial, args.timeout)
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=False)
    if not args.no_emulator:
        _emulated(mode, full, n, row)
    return row


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Four panels: load, update, extra connect latency, emulator rules per packet."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = (
        (axes[0][0], "load_s", "full rule load (s)", None),
        (axes[0][1], "update_s", "one endpoint change, load of the partial sync (s)", None),
        (axes[1][0], "extra_p50_us", "extra connect latency, last vs first Service, p50 (us)", None),
        (axes[1][1], "emu_rules_last", "emulator: rules + lookups met by a new flow (last Service)",
         "emu_lookups_last"),
    )
    for ax, key, title, second in panels:
        for mode, colour in zip(MODES, ("tab:red", "tab:blue"), strict=True):
            pts = [(r["services"], r[key]) for r in rows if r["mode"] == mode and r[key] is not None]
            if key == "emu_rules_last":
                pts = [(r["services"], r[key] + (r["emu_lookups_last"] or 0)) for r in rows
                       if r["mode"] == mode and r[key] is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", color=colour,
                        label=mode)
            if second == "extra_p99_us":
                pts = [(r["services"], r[second]) for r in rows
                       if r["mode"] == mode and r[second] is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="x", linestyle="--", color=colour,
                            label=f"{mode} p99")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("Services (x endpoints each)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("kproxy renders, real kernel (network namespace) and emulator: iptables vs nftables")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,5000,10000,20000", help="comma-separated Service counts")
    ap.add_argument("--endpoints", type=int, default=10, help="endpoints per Service")
    ap.add_argument("--connects", type=int, default=300, help="TCP connects to each of the two Services")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one kernel load may take")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--no-emulator", action="store_true", help="skip the emulator's counts")
    ap.add_argument("--out", default=str(REPO / "docs" / "scaling"), help="path of OUT.csv and OUT.png")
    ap.add_argument("--chart-only", action="store_true", help="redraw OUT.png from OUT.csv, measure nothing")
    args = ap.parse_args()
    out = Path(args.out)
    if args.chart_only:
        with open(out.with_suffix(".csv")) as f:
            rows_in: list[dict[str, Any]] = [
                {k: v if k == "mode" else float(v) if v not in ("", "None") else None for k, v in r.items()}
                for r in csv.DictReader(f)]
        chart(rows_in, out.with_suffix(".png"))
        return
    if os.geteuid() != 0:
        raise SystemExit("scaling.py needs root (network namespaces, iptables-restore, nft)")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for n in sizes:
        for mode in args.modes.split(","):
            t0 = time.perf_counter()
            row = measure(mode, n, args).csv()
            rows.append(row)
            print(f"{mode:9} {n:6}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                 for k, v in row.items() if k not in ("mode", "services"))
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
            with open(out.with_suffix(".csv"), "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
    chart(rows, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.png')}")
    if len(sizes) > 1:
        for mode in args.modes.split(","):
            ex = [r["extra_p50_us"] for r in rows if r["mode"] == mode and r["extra_p50_us"] is not None]
            if ex:
                print(f"{mode}: extra p50 latency over sizes {sizes}: {[round(x, 1) for x in ex]} us "
                      f"(median {statistics.median(ex):.1f})")


if __name__ == "__main__":
    main()
