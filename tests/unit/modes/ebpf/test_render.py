# ruff: noqa: E501  (long constructor lines are kept whole to stay readable)
"""The ebpf mode's map contents: Cilium's agent layout rules for every flag bit and backend
state, NodePort expansion, dual-stack, id stability and the partial-sync diff."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kproxy.model import IPFamily, NodeConfig, Snapshot, build_snapshot
from kproxy.modes.ebpf import (
    AffinityMatchKey,
    EbpfConfig,
    EbpfMaps,
    LBAlgorithm,
    MaglevConfig,
    MapState,
    OpKind,
    RenderedFrontend,
    Scope,
    ServiceFlag,
    ServiceFlag2,
    ServiceKey,
    ServiceValue,
    SourceRangeKey,
    render_maps,
    to_document,
)
from kproxy.modes.ebpf.layout import SOURCE_RANGE_DENY, BackendState
from kproxy.sync.tracker import changed_names
from tests.unit.modes.kube import TEST_NODE, endpoint_slice, ep, objects, port, service

NODE = EbpfConfig(node_ips=("192.168.1.10", "192.168.1.11", "fd00:1::10"))


def _snap(docs: list[dict[str, Any]], revision: int = 1) -> Snapshot:
    services, slices = objects(docs)
    return build_snapshot(services, slices, NodeConfig(hostname=TEST_NODE), revision=revision)


def _web(**spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", None)
    body = service("ns", "web", "10.96.0.10", [port("http", 80, **spec.pop("port_extra", {}))], **spec)
    if annotations:
        body["metadata"]["annotations"] = annotations
    return body


def _slice(*endpoints: dict[str, Any], name: str = "web", target: int = 8080) -> dict[str, Any]:
    return endpoint_slice("ns", name, endpoints, [("http", target, "TCP")])


def _fe(maps: EbpfMaps, address: str, scope: Scope = Scope.EXTERNAL, port_: int | None = None) -> RenderedFrontend:
    found = [fe for fe in maps.frontends if fe.plan.address == address and fe.plan.scope is scope
             and (port_ is None or fe.plan.port == port_)]
    assert len(found) == 1, [f"{fe.plan.address}:{fe.plan.port}/{fe.plan.scope}" for fe in maps.frontends]
    return found[0]


def _backend_addrs(maps: EbpfMaps, fe: RenderedFrontend) -> list[str]:
    bes = dict(maps.backends)
    return [f"{bes[i].address}:{bes[i].port}" for i in fe.slots]


def test_cluster_ip_slots_are_sorted_and_ids_start_at_one() -> None:
    maps = render_maps(_snap([_web(), _slice(ep("10.244.2.5"), ep("10.244.1.5"), ep("10.244.10.1"))]), NODE)
    fe = _fe(maps, "10.96.0.10")
    assert fe.rev_nat_index == 1
    assert _backend_addrs(maps, fe) == ["10.244.1.5:8080", "10.244.2.5:8080", "10.244.10.1:8080"]
    assert sorted(fe.slots) == [1, 2, 3]
    assert fe.master.count == 3 and fe.master.qcount == 0
    assert fe.plan.flags == ServiceFlag.NONE  # a ClusterIP is not routable from outside
    assert fe.master.algorithm is LBAlgorithm.DEFAULT and fe.master.affinity_timeout == 0
    entries = maps.entries()
    key = ServiceKey(address="10.96.0.10", dport=80, backend_slot=0, proto=6).pack()
    assert ServiceValue.unpack(entries["cilium_lb4_services_v2"][key]).count == 3
    slot2 = ServiceKey(address="10.96.0.10", dport=80, backend_slot=2, proto=6).pack()
    assert ServiceValue.unpack(entries["cilium_lb4_services_v2"][slot2]).backend_id == fe.slots[1]


def test_active_backends_come_first_and_terminating_ones_count_in_qcount() -> None:
    maps = render_maps(_snap([_web(), _slice(
        ep("10.244.1.1", ready=False, serving=True, terminating=True), ep("10.244.1.9"),
        ep("10.244.1.5", ready=False, serving=False, terminating=True))]), NODE)
    fe = _fe(maps, "10.96.0.10")
    assert _backend_addrs(maps, fe) == ["10.244.1.9:8080", "10.244.1.1:8080"]
    assert (fe.master.count, fe.master.qcount) == (1, 1)
    states = {be.address: be.state for _, be in maps.backends}
    assert states == {"10.244.1.9": BackendState.ACTIVE, "10.244.1.1": BackendState.TERMINATING}


def test_terminating_only_backends_become_selectable_as_the_fallback() -> None:
    maps = render_maps(_snap([_web(), _slice(
        ep("10.244.1.1", ready=False, serving=True, terminating=True),
        ep("10.244.1.2", ready=False, serving=True, terminating=True))]), NODE)
    fe = _fe(maps, "10.96.0.10")
    assert (fe.master.count, fe.master.qcount) == (2, 0)
    doc = to_document(maps)
    assert {b["state"] for b in doc["backends"]} == {"terminating"}


def test_no_backend_leaves_a_master_with_count_zero() -> None:
    maps = render_maps(_snap([_web()]), NODE)
    fe = _fe(maps, "10.96.0.10")
    assert fe.slots == () and fe.master.count == 0 and maps.backends == ()


def test_client_ip_affinity_sets_the_flag_timeout_and_matches_for_active_backends() -> None:
    maps = render_maps(_snap([
        _web(sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 600}}),
        _slice(ep("10.244.1.1"), ep("10.244.1.2", ready=False, serving=True, terminating=True))]), NODE)
    fe = _fe(maps, "10.96.0.10")
    assert fe.plan.flags & ServiceFlag.AFFINITY
    assert fe.master.affinity_timeout == 600
    assert fe.master.backend_id == 600  # algorithm bits 0: the datapath default
    active = dict(maps.backends)
    assert [active[i].address for i in fe.affinity_match] == ["10.244.1.1"]
    key = AffinityMatchKey(backend_id=fe.affinity_match[0], rev_nat_id=fe.rev_nat_index).pack()
    assert maps.entries()["cilium_lb_affinity_match"] == {key: b"\0"}


def test_nodeport_has_surrogates_and_one_frontend_per_node_address() -> None:
    maps = render_maps(_snap([_web(type="NodePort", port_extra={"nodePort": 30080}),
                              _slice(ep("10.244.1.1"))]), NODE)
    nodeports = sorted(fe.plan.address for fe in maps.frontends if fe.plan.port == 30080)
    assert nodeports == ["0.0.0.0", "192.168.1.10", "192.168.1.11"]
    surrogate = _fe(maps, "0.0.0.0")
    expanded = _fe(maps, "192.168.1.10")
    assert surrogate.plan.flags == ServiceFlag.NODEPORT  # not ROUTABLE
    assert expanded.plan.flags == ServiceFlag.NODEPORT | ServiceFlag.ROUTABLE
    assert len({fe.rev_nat_index for fe in maps.frontends}) == len(maps.frontends)
    assert len(maps.backends) == 1  # one backend id shared by every frontend
    narrowed = render_maps(_snap([_web(type="NodePort", port_extra={"nodePort": 30080}), _slice(ep("10.244.1.1"))]),
                           replace(NODE, nodeport_addresses=("192.168.1.11/32",)))
    assert sorted(fe.plan.address for fe in narrowed.frontends if fe.plan.port == 30080) == ["0.0.0.0",
                                                                                          "192.168.1.11"]


def test_external_traffic_policy_local_makes_two_scopes_with_local_backends_outside() -> None:
    maps = render_maps(_snap([_web(type="NodePort", externalTrafficPolicy="Local", port_extra={"nodePort": 30080}),
                              _slice(ep("10.244.1.1", TEST_NODE), ep("10.244.2.1", "other"))]), NODE)
    ext = _fe(maps, "192.168.1.10", Scope.EXTERNAL)
    internal = _fe(maps, "192.168.1.10", Scope.INTERNAL)
    assert _backend_addrs(maps, ext) == ["10.244.1.1:8080"]
    assert _backend_addrs(maps, internal) == ["10.244.1.1:8080", "10.244.2.1:8080"]
    assert ext.plan.flags & ServiceFlag.EXT_LOCAL_SCOPE and ext.plan.flags2 & ServiceFlag2.TWO_SCOPES
    cluster = _fe(maps, "10.96.0.10")
    assert not cluster.plan.flags2 & ServiceFlag2.TWO_SCOPES  # never on a ClusterIP
    assert _backend_addrs(maps, cluster) == ["10.244.1.1:8080", "10.244.2.1:8080"]
    assert to_document(maps)["services"][0]["flags"][:3] == ["NodePort", "Local", "two-scopes"]


def test_internal_traffic_policy_local_keeps_node_backends_for_the_cluster_ip() -> None:
    maps = render_maps(_snap([_web(internalTrafficPolicy="Local"),
                              _slice(ep("10.244.1.1", TEST_NODE), ep("10.244.2.1", "other"))]), NODE)
    fe = _fe(maps, "10.96.0.10")
    assert fe.plan.flags2 & ServiceFlag2.INT_LOCAL_SCOPE
    assert _backend_addrs(maps, fe) == ["10.244.1.1:8080"]


def test_load_balancer_source_ranges_are_lpm_entries_and_a_flag_on_the_lb_frontend() -> None:
    lb = _web(type="LoadBalancer", ingress=["203.0.113.7"], loadBalancerSourceRanges=["10.0.0.0/8"],
              port_extra={"nodePort": 30080}, annotations={"service.cilium.io/src-ranges-policy": "deny"})
    maps = render_maps(_snap([lb, _slice(ep("10.244.1.1"))]), NODE)
    fe = _fe(maps, "203.0.113.7")
    assert fe.plan.flags == ServiceFlag.LOADBALANCER | ServiceFlag.ROUTABLE | ServiceFlag.SOURCE_RANGE
    assert fe.plan.flags2 & SOURCE_RANGE_DENY
    key = SourceRangeKey(rev_nat_id=fe.rev_nat_index, address="10.0.0.0", prefix=8).pack()
    assert key in maps.entries()["cilium_lb4_source_range"]
    slot = ServiceValue.unpack(maps.entries()["cilium_lb4_services_v2"][
        ServiceKey(address="203.0.113.7", dport=80, backend_slot=1, proto=6).pack()])
    assert not slot.flags & ServiceFlag.SOURCE_RANGE and not slot.flags2 & SOURCE_RANGE_DENY
    assert not _fe(maps, "192.168.1.10").plan.flags & ServiceFlag.SOURCE_RANGE


def test_external_ips_are_routable_and_external_scope_only() -> None:
    maps = render_maps(_snap([_web(externalIPs=["198.51.100.1"]), _slice(ep("10.244.1.1"))]), NODE)
    fe = _fe(maps, "198.51.100.1")
    assert fe.plan.flags == ServiceFlag.EXTERNAL_IP | ServiceFlag.ROUTABLE


def test_maglev_tables_only_for_external_frontends_and_the_annotation_overrides() -> None:
    cfg = replace(NODE, algorithm="maglev", maglev=MaglevConfig(table_size=251))
    docs = [_web(type="NodePort", port_extra={"nodePort": 30080}), _slice(ep("10.244.1.1"), ep("10.244.1.2"))]
    maps = render_maps(_snap(docs), cfg)
    assert _fe(maps, "10.96.0.10").maglev == ()
    assert _fe(maps, "0.0.0.0").maglev == ()
    table = _fe(maps, "192.168.1.10").maglev
    assert len(table) == 251 and set(table) == set(_fe(maps, "192.168.1.10").slots)
    annotated = render_maps(_snap([_web(annotations={"service.cilium.io/lb-algorithm": "maglev"}),
                                   _slice(ep("10.244.1.1"))]), replace(NODE, maglev=MaglevConfig(table_size=251)))
    fe = _fe(annotated, "10.96.0.10")
    assert fe.master.algorithm is LBAlgorithm.MAGLEV and len(fe.maglev) == 251
    assert to_document(annotated)["maglev"][0]["rev_nat_index"] == fe.rev_nat_index


def test_dual_stack_fills_both_families_maps() -> None:
    svc = _web(type="NodePort", clusterIPs=["10.96.0.10", "fd00::10"], ipFamilies=["IPv4", "IPv6"],
               ipFamilyPolicy="RequireDualStack", port_extra={"nodePort": 30080})
    v6 = endpoint_slice("ns", "web", [ep("fd00:244::5")], [("http", 8080, "TCP")], suffix="6", family="IPv6")
    maps = render_maps(_snap([svc, _slice(ep("10.244.1.1")), v6]), NODE)
    entries = maps.entries()
    assert {"cilium_lb4_services_v2", "cilium_lb6_services_v2", "cilium_lb4_backends_v3",
            "cilium_lb6_backends_v3", "cilium_lb6_reverse_nat"} <= set(entries)
    assert all(len(k) == 24 for k in entries["cilium_lb6_services_v2"])
    assert sorted(fe.plan.address for fe in maps.frontends if fe.family is IPFamily.IPv6) == [
        "::", "fd00:1::10", "fd00::10"]
    doc = to_document(maps)
    assert "[fd00::10]:80/TCP" in {s["frontend"] for s in doc["services"]}
    assert "[fd00:244::5]:8080/TCP" in {b["address"] for b in doc["backends"]}


def _apply(table: dict[str, dict[bytes, bytes]], ops: tuple[Any, ...]) -> None:
    for op in ops:
        if op.kind is OpKind.UPDATE:
            table.setdefault(op.map, {})[op.key] = op.value
        else:
            del table[op.map][op.key]


def test_ids_stay_stable_and_a_partial_sync_touches_only_the_changed_service() -> None:
    other = service("ns", "db", "10.96.0.20", [port("sql", 5432)])
    docs = [_web(), _slice(ep("10.244.1.1"), ep("10.244.1.2")), other,
            endpoint_slice("ns", "db", [ep("10.244.3.1")], [("sql", 5432, "TCP")])]
    first = _snap(docs, revision=1)
    state = MapState(config=NODE)
    table: dict[str, dict[bytes, bytes]] = {}
    _apply(table, state.sync(first))
    before = state.maps()
    assert {k: v for k, v in table.items() if v} == before.entries()
    docs[1] = _slice(ep("10.244.1.1"), ep("10.244.1.2"), ep("10.244.1.3"))
    second = _snap(docs, revision=2)
    second = replace(second, changed=changed_names(first.ports, second.ports))
    ops = state.sync(second)
    after = state.maps()
    _apply(table, ops)
    assert {k: v for k, v in table.items() if v} == after.entries()
    # one backend, one slot and the master: nothing of ns/db
    assert sorted((op.map, op.kind.value) for op in ops) == [
        ("cilium_lb4_backends_v3", "update"), ("cilium_lb4_services_v2", "update"),
        ("cilium_lb4_services_v2", "update")]
    assert ops[0].map == "cilium_lb4_backends_v3"  # the backend before the slot naming it
    assert _fe(after, "10.96.0.10").rev_nat_index == _fe(before, "10.96.0.10").rev_nat_index
    assert _fe(after, "10.96.0.20") == _fe(before, "10.96.0.20")
    old_ids = dict((be.address, i) for i, be in before.backends)
    assert all(old_ids.get(be.address, i) == i for i, be in after.backends)


def test_removing_a_service_deletes_its_entries_and_frees_no_id_for_immediate_reuse() -> None:
    docs = [_web(), _slice(ep("10.244.1.1"))]
    state = MapState(config=NODE)
    table: dict[str, dict[bytes, bytes]] = {}
    _apply(table, state.sync(_snap(docs, revision=1)))
    _apply(table, state.sync(_snap([], revision=5)))
    assert all(not v for v in table.values())
    _apply(table, state.sync(_snap(docs, revision=9)))
    fe = _fe(state.maps(), "10.96.0.10")
    assert fe.rev_nat_index == 2 and fe.slots == (2,)  # the allocator moves on, as Cilium's


def test_slot_layout_of_every_backend_state() -> None:
    from kproxy.model import Protocol
    from kproxy.modes.ebpf.frontends import BackendPlan
    from kproxy.modes.ebpf.render import slot_layout

    def bes(*states: BackendState) -> list[BackendPlan]:
        return [BackendPlan(f"10.0.0.{i}", 80, Protocol.TCP, st) for i, st in enumerate(states, start=1)]

    a, t, q, m = BackendState.ACTIVE, BackendState.TERMINATING, BackendState.QUARANTINED, BackendState.MAINTENANCE
    assert slot_layout(bes(a, a, t, q, m)) == ((0, 1, 2, 3), 2, 2)  # maintenance: no slot
    assert slot_layout(bes(t, t, q)) == ((0, 1, 2), 2, 1)  # the terminating fallback
    assert slot_layout(bes(q, m)) == ((0,), 0, 1)
    assert slot_layout([]) == ((), 0, 0)


def test_a_quarantined_slot_carries_the_quarantined_bit_and_the_master_does_not() -> None:
    from kproxy.model import Protocol
    from kproxy.modes.ebpf.frontends import BackendPlan

    maps = render_maps(_snap([_web(), _slice(ep("10.244.1.1"), ep("10.244.1.2"))]), NODE)
    fe = _fe(maps, "10.96.0.10")
    plan = replace(fe.plan, backends=(BackendPlan("10.244.1.1", 8080, Protocol.TCP, BackendState.ACTIVE),
                                      BackendPlan("10.244.1.2", 8080, Protocol.TCP, BackendState.QUARANTINED)))
    quarantined = replace(fe, plan=plan, slot_states=(BackendState.ACTIVE, BackendState.QUARANTINED))
    values = [ServiceValue.unpack(v) for name, _, v in quarantined.packed if name == "cilium_lb4_services_v2"]
    assert [bool(v.flags2 & ServiceFlag2.QUARANTINED) for v in values] == [False, True, False]  # slots 1, 2, master


def test_a_frontend_two_services_claim_stays_with_the_first() -> None:
    a = service("ns", "a", "10.96.0.1", [port("p", 80)], externalIPs=["198.51.100.1"])
    b = service("ns", "b", "10.96.0.2", [port("p", 80)], externalIPs=["198.51.100.1"])
    docs = [a, b, endpoint_slice("ns", "a", [ep("10.244.1.1")], [("p", 8080, "TCP")]),
            endpoint_slice("ns", "b", [ep("10.244.2.1")], [("p", 8080, "TCP")])]
    state = MapState(config=NODE)
    table: dict[str, dict[bytes, bytes]] = {}
    _apply(table, state.sync(_snap(docs, revision=1)))
    fe = _fe(state.maps(), "198.51.100.1")
    assert str(fe.name) == "ns/a:p"
    _apply(table, state.sync(_snap(docs[1:2] + docs[3:], revision=7)))  # a goes away
    assert {k: v for k, v in table.items() if v} == state.maps().entries()
