"""``--cleanup`` removes what the iptables and ipvs modes programmed, and nothing of other components."""

from __future__ import annotations

import asyncio

from emulation import ManualClock
from emulation.netfilter import Netns, Ruleset
from kproxy.kernel import EmulatedIpvs, EmulatedNetfilter, IpvsNode, run_now
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer, load_now
from kproxy.modes.iptables.cleanup import cleanup as iptables_cleanup
from kproxy.modes.ipvs import IpvsConfig
from kproxy.modes.ipvs.cleanup import cleanup as ipvs_cleanup
from kproxy.modes.ipvs.mode import IpvsMode
from tests.scenarios import NODE, cluster, node_model
from tests.unit.modes.kube import snapshot_of

#: Another component's rules on the same node, which a cleanup must leave alone.
OTHERS = ("*nat\n:DOCKER - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n"
          "-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE\nCOMMIT\n"
          "*filter\n:DOCKER-USER - [0:0]\n-A FORWARD -j DOCKER-USER\nCOMMIT\n")


def _kube(save: str) -> list[str]:
    """The lines of ``save`` that are kube-proxy's (kubelet's KUBE-FIREWALL excepted)."""
    return [line for line in save.splitlines() if "KUBE-" in line and "KUBE-FIREWALL" not in line]


def test_iptables_cleanup_removes_kube_proxy_chains_and_jumps_only() -> None:
    """After a full sync, cleanup leaves no kube-proxy chain or jump, and Docker's rules as they were."""
    kernel = EmulatedNetfilter(Netns(node_model(), ManualClock(), ruleset=Ruleset(4)))
    run_now(kernel.restore(OTHERS))
    others_before = [line for line in kernel.save().splitlines() if "DOCKER" in line]
    config = IptablesConfig(node_ips=("192.168.0.2",), cluster_cidr=("10.0.0.0/8",))
    load_now(kernel, IptablesRenderer(config).render(snapshot_of(cluster(), hostname=NODE)))
    assert len(_kube(kernel.save())) > 20
    assert asyncio.run(iptables_cleanup(kernel)) == []
    assert _kube(kernel.save()) == []
    assert [line for line in kernel.save().splitlines() if "DOCKER" in line] == others_before
    assert asyncio.run(iptables_cleanup(kernel)) == []  # nothing left to remove is not an error


def test_ipvs_cleanup_removes_virtual_servers_addresses_sets_and_rules() -> None:
    """After an ipvs sync, cleanup leaves no virtual server, bound address, kube-proxy set, chain or jump."""
    node = IpvsNode(node_model(), ManualClock())
    mode = IpvsMode.emulated(IpvsConfig(node_ips=("192.168.0.2",)), node)
    asyncio.run(mode.apply(snapshot_of(cluster(), hostname=NODE)))
    assert node.ipvs.services() and node.bound and node.ipsets.sets
    assert asyncio.run(ipvs_cleanup(EmulatedIpvs(node))) == []
    assert node.ipvs.services() == () and node.bound == ()
    assert not [name for name in node.ipsets.sets if name.startswith("KUBE-")]
    assert _kube(node.netns.save()) == []
