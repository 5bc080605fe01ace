# ruff: noqa: E501  (cluster literals and test names are kept whole to stay readable)
"""Stateful property: the iptables mode's partial syncs always leave the node as a fresh full sync would.

A ``RuleBasedStateMachine`` adds, changes and removes Services and their EndpointSlices while
flows are open. After every sync (a partial one after the first) the emulated node's rules equal
those of a fresh node given one full sync of the same state (canonically: per table and chain,
the rules in order), open flows keep their endpoint (conntrack, as the kernel), and no packet to
an address outside the cluster's Services is ever translated. Example counts are for the ``ci``
profile; ``HYPOTHESIS_PROFILE=thorough`` multiplies them by 20.
"""

from __future__ import annotations

import os
import random
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from emulation import ManualClock
from emulation import Packet as EmulatedPacket
from emulation.netfilter import Netns, Ruleset, load
from kproxy.kernel.emulated import EmulatedNetfilter
from kproxy.model import EndpointSlice, IPFamily, Service, parse_objects
from kproxy.modes.iptables import IptablesRenderer, render_full
from kproxy.modes.iptables.mode import load_now
from kproxy.sources import Event, EventType
from kproxy.sync import ChangeTracker
from kproxy.testing import Cluster, NodeSpec, emulated_node, endpoint_slices, packets, services
from kproxy.testing.modes import iptables_config

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
NODE = NodeSpec()
FAMILIES = (IPFamily.IPv4, IPFamily.IPv6)


def canonical(netns: Netns) -> dict[str, dict[str, list[str]]]:
    """The node's rules as ``{table: {chain: [rule specs in order]}}``."""
    ruleset = load(netns.save(), version=netns.ruleset.version)
    return {name: {c: [r.spec() for r in chain.rules] for c, chain in table.chains.items()}
            for name, table in ruleset.tables.items()}


def _objects(doc: dict[str, Any]) -> list[Service | EndpointSlice]:
    result = parse_objects(doc)
    assert not result.problems, result.problems
    return [o for o in result.objects if isinstance(o, Service | EndpointSlice)]


class IptablesSyncMachine(RuleBasedStateMachine):
    """Partial syncs of a changing cluster against fresh full syncs, with open flows."""

    indices = Bundle("indices")

    def __init__(self) -> None:
        super().__init__()
        self.tracker = ChangeTracker(NODE.node_config())
        self.docs: dict[int, list[dict[str, Any]]] = {}
        self.clock = ManualClock()
        self.nodes = {f: Netns(emulated_node(NODE), self.clock, ruleset=Ruleset(6 if f is IPFamily.IPv6 else 4))
                      for f in FAMILIES}
        self.kernels = {f: EmulatedNetfilter(self.nodes[f], f) for f in FAMILIES}
        self.renderers = {f: IptablesRenderer(iptables_config(Cluster(manifests=()), f)) for f in FAMILIES}
        self.flows: list[tuple[IPFamily, EmulatedPacket, str]] = []
        self.rng = random.Random(0)
        self.syncs = 0

    # -- changes ----------------------------------------------------------------------------

    def _replace(self, index: int, docs: list[dict[str, Any]]) -> None:
        old = {(type(o).__name__, o.namespace, o.name): o for d in self.docs.get(index, []) for o in _objects(d)}
        new = {(type(o).__name__, o.namespace, o.name): o for d in docs for o in _objects(d)}
        events = [Event(type=EventType.DELETED, obj=o) for k, o in old.items() if k not in new]
        events += [Event(type=EventType.UPDATED if k in old else EventType.ADDED, obj=o) for k, o in new.items()]
        self.tracker.apply_all(events)
        if docs:
            self.docs[index] = docs
        else:
            self.docs.pop(index, None)
        self._sync()

    def _sync(self) -> None:
        snapshot = self.tracker.checkout()
        for family in FAMILIES:
            result = self.renderers[family].render(snapshot)
            load_now(self.kernels[family], result)
            self.renderers[family].commit(result)
        self.syncs += 1

    @rule(target=indices, index=st.integers(min_value=0, max_value=5), data=st.data())
    def add_service(self, index: int, data: st.DataObject) -> int:
        """Add (or replace) Service ``index`` with its slices."""
        svc = data.draw(services(index=index, max_ports=2), label="service")
        self._replace(index, [svc, *data.draw(endpoint_slices(svc, node=NODE), label="slices")])
        return index

    @rule(index=indices, data=st.data())
    def change_endpoints(self, index: int, data: st.DataObject) -> None:
        """Replace the slices of Service ``index`` (if it still exists)."""
        if index not in self.docs:
            return
        svc = self.docs[index][0]
        self._replace(index, [svc, *data.draw(endpoint_slices(svc, node=NODE), label="slices")])

    @rule(index=consumes(indices))
    def remove_service(self, index: int) -> None:
        """Remove Service ``index`` and its slices."""
        self._replace(index, [])

    @rule(data=st.data())
    def open_flow(self, data: st.DataObject) -> None:
        """Open a flow to some service address and remember where it went."""
        cluster = self.cluster()
        packet = data.draw(packets(cluster), label="flow")
        emulated = packet.to_emulated()
        outcome = self.nodes[packet.family].send(emulated, self.rng)
        if outcome.verdict == "ACCEPT" and outcome.dnat:
            self.flows.append((packet.family, emulated, outcome.destination))

    # -- invariants ---------------------------------------------------------------------------

    def cluster(self) -> Cluster:
        """The cluster as it is now."""
        return Cluster(manifests=tuple(d for docs in self.docs.values() for d in docs), node=NODE)

    @invariant()
    def partial_state_equals_a_fresh_full_sync(self) -> None:
        """The node's rules equal a fresh node's after one full sync of the current state."""
        if not self.syncs:
            return
        snapshot = self.tracker.snapshot
        assert snapshot is not None
        for family in FAMILIES:
            fresh = Netns(emulated_node(NODE), ManualClock(), ruleset=Ruleset(self.nodes[family].ruleset.version))
            config = iptables_config(self.cluster(), family)
            kernel = EmulatedNetfilter(fresh, family)
            load_now(kernel, IptablesRenderer(config).render(snapshot))
            assert canonical(self.nodes[family]) == canonical(fresh), render_full(snapshot, config)

    @invariant()
    def open_flows_keep_their_endpoint(self) -> None:
        """Every open flow's next packet reaches the endpoint its first packet reached."""
        for family, packet, destination in self.flows:
            again = self.nodes[family].send(EmulatedPacket(
                src=packet.src, dst=packet.dst, sport=packet.sport, dport=packet.dport,
                protocol=packet.protocol, in_interface=packet.in_interface, syn=False), self.rng)
            assert again.destination == destination

    @invariant()
    def nothing_outside_the_cluster_is_translated(self) -> None:
        """Packets to unknown addresses and ports pass untranslated; translations reach only endpoints."""
        cluster = self.cluster()
        endpoints = cluster.endpoint_addresses()
        for family in FAMILIES:
            version = 6 if family is IPFamily.IPv6 else 4
            unknown = ("203.0.113.77", "10.96.200.1") if version == 4 else ("2001:db8:203::77", "fd00:10:96::c8")
            for dst in unknown:
                for origin_src, iface in ((("10.244.0.2" if version == 4 else "fd00:10:244::2"), "cbr0"),
                                          (("203.0.113.2" if version == 4 else "2001:db8:203::2"), "eth0")):
                    p = EmulatedPacket(src=origin_src, dst=dst, sport=40000, dport=80, in_interface=iface)
                    assert not any(o.dnat for _, o in self.nodes[family].enumerate(p))
        for family in FAMILIES:
            for packet in self._service_packets(cluster, family):
                reached = {o.destination for _, o in self.nodes[family].enumerate(packet) if o.dnat}
                assert reached <= endpoints, (packet, reached)

    def _service_packets(self, cluster: Cluster, family: IPFamily) -> list[EmulatedPacket]:
        """A packet from an external client to every service address of ``family``."""
        v6 = family is IPFamily.IPv6
        node_ip = NODE.node_ip(6 if v6 else 4)
        out = []
        for info in cluster.snapshot:
            if info.family is not family:
                continue
            aims = [(info.cluster_ip, info.port), *((ip, info.port) for ip in info.external_ips),
                    *((ip, info.port) for ip in info.load_balancer_ips)]
            if info.node_port and node_ip:
                aims.append((node_ip, info.node_port))
            out += [EmulatedPacket(src="2001:db8:203::9" if v6 else "203.0.113.9", dst=dst, sport=40001,
                                   dport=port, protocol=info.protocol.value.lower(),  # type: ignore[arg-type]
                                   in_interface="eth0") for dst, port in aims]
        return out


TestIptablesSyncMachine = IptablesSyncMachine.TestCase
TestIptablesSyncMachine.settings = settings(
    max_examples=800 if THOROUGH else 40, stateful_step_count=12, deadline=None, derandomize=not THOROUGH)
