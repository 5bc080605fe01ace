"""A node without the ``conntrack`` tool: the iptables mode says once what is lost, not at every sync."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from kproxy.kernel import EmulatedNetfilter
from kproxy.kernel.conntrack import ConntrackFilter
from kproxy.kernel.linux import LinuxNetfilter
from kproxy.modes.iptables import IptablesConfig
from kproxy.modes.iptables.mode import IptablesMode
from tests.unit.kernel.test_conntrack_cleanup import _docs, _node
from tests.unit.modes.kube import next_snapshot, snapshot_of


class _LinuxConntrack(EmulatedNetfilter):
    """Emulated tables whose conntrack cleanup runs the real ``conntrack`` tool from PATH."""

    async def clear_conntrack(self, filters: Sequence[ConntrackFilter]) -> int:
        return await LinuxNetfilter(self.family).clear_conntrack(filters)


def test_a_missing_conntrack_tool_is_logged_once_with_what_is_lost(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Three syncs that each need a cleanup, with no conntrack on PATH: one warning naming stale UDP flows."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no conntrack tool
    mode = IptablesMode(IptablesConfig(node_ips=("192.168.0.2",)), _LinuxConntrack(_node()), now=lambda: 0.0)
    snapshot = snapshot_of(_docs(["10.0.1.1"]))
    with capture_logs() as logs:
        asyncio.run(mode.apply(snapshot))
        for endpoints in (["10.0.1.2"], ["10.0.1.3"], ["10.0.1.4"]):
            snapshot = next_snapshot(snapshot, _docs(endpoints))
            asyncio.run(mode.apply(snapshot))
    assert mode.history[-1].ok  # the rules were programmed every time
    failed = [e for e in logs if e["event"].startswith("conntrack cleanup failed")]
    warnings = [e for e in failed if e["log_level"] == "warning"]
    assert len(warnings) == 1, warnings
    assert "stale UDP" in warnings[0]["event"] and "conntrack" in warnings[0]["error"]
    assert len(failed) >= 3  # the later ones at debug level only
