"""The hooks between the sync engine and the metrics: what each sync, change and failure records."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

from emulation import ManualClock
from emulation.netfilter import Netns, Ruleset
from kproxy.daemon.engine import build_engine
from kproxy.kernel.emulated import EmulatedNetfilter
from kproxy.kernel.node import trace_node
from kproxy.model import IPFamily, NodeConfig
from kproxy.modes.iptables.config import IptablesConfig
from kproxy.modes.iptables.mode import IptablesMode
from kproxy.observability import Observability, ObservabilityOptions
from kproxy.observability.instrument import family_of
from kproxy.sources.memory import MemorySource
from kproxy.sync import SyncEngine
from tests.fakeapi.objects import rfc3339
from tests.unit.sync.builders import eps, running, svc

_NO_SERVERS = ObservabilityOptions(healthz_bind_address="", metrics_bind_address="")
_DUAL = NodeConfig(hostname="node-a", ip_families=(IPFamily.IPv4, IPFamily.IPv6))
#: A stale service chain held by a foreign rule: kube-proxy's full sync deletes stale
#: ``KUBE-SVC-*`` chains, and iptables-restore refuses to delete a chain still referenced.
_POISON = ("*nat\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:MINE - [0:0]\n"
           "-A MINE -j KUBE-SVC-AAAAAAAAAAAAAAAA\nCOMMIT\n")


def _mode(family: IPFamily) -> IptablesMode:
    config = IptablesConfig.kube_proxy_test_fake(family)
    netns = Netns(trace_node(config.node_ips), ManualClock(),
                  ruleset=Ruleset(6 if family is IPFamily.IPv6 else 4))
    return IptablesMode(config, EmulatedNetfilter(netns, family), now=time.monotonic)


def _failures(obs: Observability, family: str) -> float:
    value = obs.metrics.registry.get_sample_value(
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total", {"ip_family": family})
    assert value is not None, f"no restore-failure sample for {family}"
    return value


def _samples(obs: Observability, name: str) -> float | None:
    return obs.metrics.registry.get_sample_value(name)


async def _engine(modes: list[IptablesMode], source: MemorySource) -> tuple[SyncEngine, Observability]:
    engine, obs = build_engine(source, _DUAL, modes, min_sync_period_s=0.0, sync_period_s=30.0,
                               observability=_NO_SERVERS)
    assert obs is not None
    return engine, obs


def test_a_mode_carries_its_family() -> None:
    """family_of reads an iptables mode's family from its configuration; a plain object has none."""
    assert family_of(_mode(IPFamily.IPv6)) == "IPv6"
    assert family_of(object()) is None  # type: ignore[arg-type]


async def test_an_ipv4_restore_failure_counts_for_ipv4_only() -> None:
    """A restore refused in the IPv4 kernel raises the IPv4 failure counter and leaves IPv6's at zero."""
    v4, v6 = _mode(IPFamily.IPv4), _mode(IPFamily.IPv6)
    await v4.kernel.restore(_POISON)
    source = MemorySource([svc("web", "10.96.0.10")])
    engine, obs = await _engine([v4, v6], source)
    async with running(engine.run):
        await _until(lambda: engine.failure_count >= 1)
    assert _failures(obs, "IPv4") >= 1
    assert _failures(obs, "IPv6") == 0


async def test_an_ipv6_restore_failure_counts_for_ipv6_only() -> None:
    """With IPv4 programmed and the IPv6 restore refused, only the IPv6 counter rises."""
    v4, v6 = _mode(IPFamily.IPv4), _mode(IPFamily.IPv6)
    await v6.kernel.restore(_POISON)
    engine, obs = await _engine([v4, v6], MemorySource([svc("web", "10.96.0.10")]))
    async with running(engine.run):
        await _until(lambda: engine.failure_count >= 1)
    assert v4.history and v4.history[-1].ok
    assert _failures(obs, "IPv6") >= 1
    assert _failures(obs, "IPv4") == 0


async def test_last_queued_timestamp_is_set_at_start_in_a_quiet_cluster() -> None:
    """A proxy started on an empty source has a last-queued sample per family (kube-proxy's SyncLoop)."""
    before = time.time()
    engine, obs = await _engine([_mode(IPFamily.IPv4), _mode(IPFamily.IPv6)], MemorySource())
    async with running(engine.run):
        await engine.wait_synced(1)
    for family in ("IPv4", "IPv6"):
        value = obs.metrics.registry.get_sample_value(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", {"ip_family": family})
        assert value is not None and before <= value <= time.time()


async def test_deleting_an_endpoint_slice_adds_no_network_programming_observation() -> None:
    """An added slice with a trigger time is observed once; deleting it (same trigger time) adds nothing."""
    source = MemorySource([svc("web", "10.96.0.10")])
    engine, obs = await _engine([_mode(IPFamily.IPv4)], source)
    name = "kubeproxy_network_programming_duration_seconds_count"
    async with running(engine.run):
        await engine.wait_synced(1)
        slice_ = dataclasses.replace(eps("web-abc", "web", ["10.0.0.1"]), trigger_time=rfc3339(time.time()))
        source.add(slice_)
        await engine.wait_synced(2)
        assert _samples(obs, name) == 1
        source.delete(slice_)
        await engine.wait_synced(3)
        assert engine.snapshot is not None and not engine.snapshot.get("default/web").endpoints  # type: ignore[union-attr]
        assert _samples(obs, name) == 1


async def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)
