# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""The emulated applier: jump rules as kube-proxy ensures them, atomic restores, nfacct objects."""

from __future__ import annotations

import asyncio

import pytest

from emulation import ManualClock
from emulation.netfilter import Netns, Ruleset
from kproxy.errors import KernelError
from kproxy.kernel import EmulatedNetfilter
from kproxy.model import IPFamily
from kproxy.modes.iptables import ENSURED_JUMPS, IptablesConfig, IptablesRenderer, RenderResult
from kproxy.modes.iptables.mode import load_now, program
from tests.scenarios import CONFIGS, NODE, cluster, node_model
from tests.unit.modes.kube import snapshot_of


def _kernel() -> EmulatedNetfilter:
    return EmulatedNetfilter(Netns(node_model(), ManualClock(), ruleset=Ruleset(4)))


def _result(config: IptablesConfig = CONFIGS["detect"]) -> RenderResult:
    return IptablesRenderer(config).render(snapshot_of(cluster(), hostname=NODE))


def test_full_sync_installs_the_jump_rules_in_kube_proxy_order() -> None:
    """INPUT holds kubelet's KUBE-FIREWALL jump first, then kube-proxy's, as prepends leave them."""
    kernel = _kernel()
    load_now(kernel, _result())
    chain = kernel.netns.ruleset.chain("filter", "INPUT")
    assert chain is not None
    targets = [r.text().rsplit(" ", 1)[1] for r in chain.rules]
    assert targets == ["KUBE-FIREWALL", "KUBE-PROXY-FIREWALL", "KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES"]


def test_jump_rules_are_not_duplicated_by_later_full_syncs() -> None:
    """Ensuring twice leaves one copy of each jump rule."""
    kernel = _kernel()
    load_now(kernel, _result())
    load_now(kernel, _result())
    count = sum(len(t.chains[c].rules) for t in kernel.netns.ruleset.tables.values()
                for c in ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING") if c in t.chains)
    assert count == len(ENSURED_JUMPS)


def test_a_failed_restore_changes_nothing() -> None:
    """A restore naming a missing chain raises KernelError with the line, and the rules stay."""
    kernel = _kernel()
    load_now(kernel, _result())
    before = kernel.save()
    bad = RenderResult(text="*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j KUBE-NOWHERE\nCOMMIT\n",
                       full=True, large_cluster=False, written_ports=0, deleted_chains=(),
                       filter_rules=0, nat_rules=1)
    with pytest.raises(KernelError, match="KUBE-NOWHERE"):
        load_now(kernel, bad)
    assert kernel.save() == before


def test_nfacct_objects_must_exist_before_rules_use_them() -> None:
    """With nfacct on, the counters are created on a full sync; a partial one cannot create them."""
    config = IptablesConfig(node_ips=("192.168.0.2",), nfacct=True)
    renderer = IptablesRenderer(config)
    result = renderer.render(snapshot_of(cluster(), hostname=NODE))
    with pytest.raises(KernelError, match="nfacct"):
        load_now(_kernel(), result)
    kernel = _kernel()
    load_now(kernel, result, nfacct=("ct_state_invalid_dropped_pkts", "localhost_nps_accepted_pkts"))
    assert "localhost_nps_accepted_pkts" in kernel.nfacct_objects


def test_program_through_the_async_interface_and_list_chains() -> None:
    """The mode's sequence over the async NetfilterKernel methods programs the rules; list_chains sees them."""
    kernel = _kernel()
    asyncio.run(program(kernel, _result()))
    chains = asyncio.run(kernel.list_chains("nat"))
    assert {"KUBE-SERVICES", "KUBE-POSTROUTING", "PREROUTING"} <= chains
    assert any(c.startswith("KUBE-SVC-") for c in chains)


def test_wrong_family_is_refused() -> None:
    """An IPv6 applier refuses to load into an IPv4 namespace."""
    kernel = EmulatedNetfilter(Netns(node_model(), ManualClock(), ruleset=Ruleset(4)), family=IPFamily.IPv6)
    result = IptablesRenderer(IptablesConfig(family=IPFamily.IPv6)).render(snapshot_of(cluster(), hostname=NODE))
    with pytest.raises(KernelError, match="IPv6"):
        load_now(kernel, result)
