# ruff: noqa: E501  (long strategy lines are kept whole to stay readable)
"""Partial syncs (Hypothesis): over random sequences of cluster changes, the map operations
turn the previous contents into exactly the new ones, touch only the entries of the changed
Services, and keep the ids of the frontends and backends that live on."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.model import NodeConfig, build_snapshot
from kproxy.modes.ebpf import EbpfConfig, MaglevConfig, MapState, OpKind
from kproxy.sync.tracker import changed_names
from tests.unit.modes.kube import TEST_NODE, endpoint_slice, ep, objects, port, service

CONFIG = EbpfConfig(node_ips=("192.168.1.10",), algorithm="maglev", maglev=MaglevConfig(table_size=251))

_svc = st.fixed_dictionaries({
    "present": st.booleans(),
    "type": st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]),
    "etp_local": st.booleans(),
    "affinity": st.booleans(),
    "ranges": st.booleans(),
    "endpoints": st.lists(st.tuples(st.integers(1, 6), st.booleans(), st.sampled_from(["ready", "terminating", "gone"])),
                          max_size=5, unique_by=lambda t: t[0]),
})


def _docs(state: list[dict[str, Any]]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for i, s in enumerate(state):
        if not s["present"]:
            continue
        spec: dict[str, Any] = {"type": s["type"]}
        extra: dict[str, Any] = {}
        if s["type"] != "ClusterIP":
            extra["nodePort"] = 30000 + i
            if s["etp_local"]:
                spec["externalTrafficPolicy"] = "Local"
        if s["type"] == "LoadBalancer":
            spec["ingress"] = [f"203.0.113.{i + 1}"]
            if s["ranges"]:
                spec["loadBalancerSourceRanges"] = ["10.0.0.0/8"]
        if s["affinity"]:
            spec["sessionAffinity"] = "ClientIP"
        docs.append(service("ns", f"s{i}", f"10.96.0.{i + 1}", [port("p", 80, **extra)], **spec))
        eps = []
        for host, local, cond in s["endpoints"]:
            conditions = {"ready": cond == "ready", "serving": cond != "gone", "terminating": cond != "ready"}
            eps.append(ep(f"10.244.0.{host}", TEST_NODE if local else "other", **conditions))
        docs.append(endpoint_slice("ns", f"s{i}", eps, [("p", 8080, "TCP")]))
    return docs


def _snap(state: list[dict[str, Any]], revision: int) -> Any:
    services, slices = objects(_docs(state))
    return build_snapshot(services, slices, NodeConfig(hostname=TEST_NODE), revision=revision)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.lists(_svc, min_size=3, max_size=3), min_size=2, max_size=5))
def test_operations_replay_to_the_full_contents_and_touch_only_changed_services(steps: list[list[dict[str, Any]]]) -> None:
    maps = MapState(config=CONFIG)
    table: dict[str, dict[bytes, bytes]] = {}
    previous = None
    for revision, state in enumerate(steps, start=1):
        snap = _snap(state, revision)
        if previous is not None:
            snap = replace(snap, changed=changed_names(previous.ports, snap.ports))
        before = maps.maps()
        ops = maps.sync(snap)
        after = maps.maps()
        for op in ops:
            if op.kind is OpKind.UPDATE:
                assert op.value is not None
                table.setdefault(op.map, {})[op.key] = op.value
            else:
                del table[op.map][op.key]
        assert {k: v for k, v in table.items() if v} == after.entries()
        # Frontends of unchanged Services are the same objects' entries, untouched.
        unchanged = [fe for fe in before.frontends if fe.name not in snap.changed]
        owned = {(name, key) for fe in unchanged for name, key, _ in fe.packed}
        assert not owned & {(op.map, op.key) for op in ops}
        assert [fe for fe in after.frontends if fe.name not in snap.changed] == unchanged
        # Ids of frontends and backends that live on do not change.
        old_ids = {fe.plan.key: fe.rev_nat_index for fe in before.frontends}
        assert all(old_ids.get(fe.plan.key, fe.rev_nat_index) == fe.rev_nat_index for fe in after.frontends)
        old_be = {(be.address, be.port): i for i, be in before.backends}
        assert all(old_be.get((be.address, be.port), i) == i for i, be in after.backends)
        # Every slot names a backend that exists.
        ids = {i for i, _ in after.backends}
        assert all(set(fe.slots) <= ids and set(fe.maglev) <= ids for fe in after.frontends)
        previous = snap
