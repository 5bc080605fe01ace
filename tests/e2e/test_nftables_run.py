"""``kproxy run --proxy-mode nftables``: keeps an emulated node, or a real namespace's nftables, in sync.

The emulated run answers /healthz, /metrics and /proxyMode as the other kernel modes do, and its
debug log shows kube-proxy's sync choreography: a full sync at start, partial syncs after, and a
deleted Service's chains flushed on one sync and deleted on a later one. The root test runs
``--kernel linux`` inside a namespace it creates and compares the kernel's table with the
emulated kernel's table for the same manifests.
"""

from __future__ import annotations

import asyncio
import json
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kproxy.kernel import emulated_nftables
from kproxy.model.names import IPFamily
from kproxy.modes.nftables import NftablesConfig, NftablesMode, canonical_listing
from tests.conftest import require_kernel
from tests.e2e.test_ipvs_run import _free_port, _get, _poll, _syncs
from tests.kernel.netns import cleanup_stale, netns, sh
from tests.scenarios import NODE, cluster
from tests.unit.modes.kube import snapshot_of

_DEADLINE_S = 20.0
_SYNCED = re.compile(r"nftables synced\s+deleted_chains=(\d+) family=\S+ full=(True|False) "
                     r"operations=(\d+) revision=\d+ written_ports=(\d+)")


def _write(path: Path, docs: list[dict[str, object]]) -> None:
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))


def _without_ns1(docs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [d for d in docs if d["metadata"]["namespace"] != "ns1"]  # type: ignore[index]


def _start(prefix: list[str], manifests: Path, kernel: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*prefix, sys.executable, "-m", "kproxy", "run", "--manifests", str(manifests),
                             "--proxy-mode", "nftables", "--kernel", kernel, "--hostname-override", NODE,
                             "--ip-families", "IPv4", "--node-ip", "192.168.0.2", "--min-sync-period", "0s",
                             "--sync-period", "1s", "--log-level", "debug", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err


def _read_until(proc: subprocess.Popen[str], done: object) -> str:
    """stderr of ``proc`` until ``done(text so far)`` holds (or all there is by the deadline)."""
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + _DEADLINE_S
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline and not done("".join(seen)):  # type: ignore[operator]
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                line = proc.stderr.readline()
                if not line:
                    break
                seen.append(line)
    return "".join(seen)


def _deleted_after_change(text: str) -> bool:
    """A partial sync that changed something (flushed the Service's chains), then a later sync
    that deleted stale chains."""
    syncs = [(int(d), full == "True", int(ops), int(w)) for d, full, ops, w in _SYNCED.findall(text)]
    wrote = next((i for i, s in enumerate(syncs) if not s[1] and s[2] > 0), None)
    return wrote is not None and any(s[0] > 0 for s in syncs[wrote + 1:])


def test_run_nftables_emulated_serves_health_and_syncs_partially(tmp_path: Path) -> None:
    """The emulated nftables run answers /healthz, /proxyMode nftables and /metrics; the first sync is
    full, a manifest change is a partial sync, and the deleted Service's stale chains are deleted on a
    later sync."""
    manifests = tmp_path / "cluster.json"
    docs = cluster()
    _write(manifests, docs)
    healthz, metrics = _free_port(), _free_port()
    proc = _start([], manifests, "emulated", "--healthz-bind-address", f"127.0.0.1:{healthz}",
                  "--metrics-bind-address", f"127.0.0.1:{metrics}")
    try:
        assert _poll(f"http://127.0.0.1:{healthz}/healthz", lambda r: r[0] == 200)[0] == 200
        assert _get(f"http://127.0.0.1:{metrics}/proxyMode") == (200, "nftables")
        _, text = _poll(f"http://127.0.0.1:{metrics}/metrics", lambda r: _syncs(r[1]) >= 1)
        assert _syncs(text) >= 1
        first = _read_until(proc, lambda t: "nftables synced" in t)
        _write(manifests, _without_ns1(docs))
        later = _read_until(proc, _deleted_after_change)
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    syncs = _SYNCED.findall(first + later)
    assert syncs and syncs[0][1] == "True" and int(syncs[0][2]) > 0, first
    assert _deleted_after_change(later), later


def _emulated_table(docs: list[dict[str, object]]) -> str:
    """The table the emulated kernel holds after the mode's sync of ``docs`` with the run's flags."""
    kernel = emulated_nftables(("192.168.0.2",), IPFamily.IPv4)
    mode = NftablesMode(NftablesConfig(node_ips=("192.168.0.2",)), kernel, now=lambda: 0.0)
    asyncio.run(mode.apply(snapshot_of(docs, hostname=NODE)))
    return asyncio.run(kernel.list_ruleset())


def _wait(ns: str, ok: object) -> str:
    deadline = time.monotonic() + _DEADLINE_S
    listing = ""
    while time.monotonic() < deadline:
        listing = sh("ip", "netns", "exec", ns, "nft", "list", "table", "ip", "kube-proxy",
                     check=False).stdout
        if ok(listing):  # type: ignore[operator]
            return listing
        time.sleep(0.2)
    return listing


@pytest.mark.kernel
def test_run_nftables_linux_programs_what_the_emulator_holds_and_follows_changes(tmp_path: Path) -> None:
    """In a namespace, `--kernel linux` loads the same table the emulated kernel holds for the manifests;
    after a Service goes, its chains are flushed then deleted, and the table again equals the emulator's."""
    require_kernel("nft")
    cleanup_stale()
    manifests = tmp_path / "cluster.json"
    docs = cluster()
    _write(manifests, docs)
    with netns("nftrun") as ns:
        proc = _start(["ip", "netns", "exec", ns], manifests, "linux")
        try:
            want = canonical_listing(_emulated_table(docs))
            listing = _wait(ns, lambda text: canonical_listing(text) == want)
            assert canonical_listing(listing) == want
            assert "ns1/svc1" in listing
            _write(manifests, _without_ns1(docs))
            want = canonical_listing(_emulated_table(_without_ns1(docs)))
            listing = _wait(ns, lambda text: canonical_listing(text) == want)
            assert "ns1/svc1" not in listing
            assert canonical_listing(listing) == want
        finally:
            code, err = _stop(proc)
        assert code == 0, err
