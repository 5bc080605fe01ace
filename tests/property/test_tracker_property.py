"""Property: the incremental tracker always agrees with a Snapshot built from scratch.

For any sequence of add/update/delete events of small Services and EndpointSlices, with
checkouts at arbitrary points, every ``checkout()`` has the same state as
``build_snapshot(final services, final slices, node)`` and its ``changed`` is exactly the set of
ServicePortNames whose infos differ from the previous checkout; so the union of ``changed``
covers every port whose state differs from the start.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.model import (
    EndpointConditions,
    EndpointPort,
    EndpointSlice,
    IPFamily,
    NodeConfig,
    Protocol,
    Service,
    ServicePort,
    ServicePortName,
    ServiceType,
    SliceEndpoint,
    TrafficPolicy,
    build_snapshot,
)
from kproxy.sources import Event, EventType, ObjectKey, object_key
from kproxy.sync import ChangeTracker, changed_names

NODE = NodeConfig(hostname="node-1", zone="z1")
NAMES = ("a", "b")
PORTS = (("", 80, Protocol.TCP), ("http", 80, Protocol.TCP), ("dns", 53, Protocol.UDP))


@st.composite
def services(draw: st.DrawFn) -> Service:
    """Small Services: a few names, cluster IPs (v4, v6, dual), ports, types and policies."""
    ports = draw(st.sampled_from([(PORTS[0],), (PORTS[1],), (PORTS[1], PORTS[2]), ()]))
    svc_type = draw(st.sampled_from([ServiceType.ClusterIP, ServiceType.NodePort]))
    return Service(
        namespace="ns", name=draw(st.sampled_from(NAMES)),
        cluster_ips=draw(st.sampled_from([("10.0.0.1",), ("10.0.0.1",), ("10.0.0.2",), ("fd00::1",),
                                          ("10.0.0.1", "fd00::1"), ()])),
        type=svc_type,
        ports=tuple(ServicePort(name=n, port=p, protocol=pr, target_port=p,
                                node_port=30000 + p if svc_type is ServiceType.NodePort else 0)
                    for n, p, pr in ports),
        internal_traffic_policy=draw(st.sampled_from(TrafficPolicy)),
        external_traffic_policy=draw(st.sampled_from(TrafficPolicy)),
    )


@st.composite
def endpoint_slices(draw: st.DrawFn) -> EndpointSlice:
    """Small slices: a few names and owners, overlapping IPs, conditions, nodes and zones."""
    family = draw(st.sampled_from([IPFamily.IPv4, IPFamily.IPv4, IPFamily.IPv4, IPFamily.IPv6]))
    ips = ["10.1.0.1", "10.1.0.2", "10.1.0.3"] if family is IPFamily.IPv4 else ["fd01::1", "fd01::2"]
    endpoints = draw(st.lists(st.builds(
        SliceEndpoint,
        address=st.sampled_from(ips),
        conditions=st.builds(EndpointConditions, ready=st.booleans(), serving=st.booleans(),
                             terminating=st.booleans()),
        node_name=st.sampled_from([None, "node-1", "node-2"]),
        zone=st.sampled_from([None, "z1", "z2"]),
        zone_hints=st.sampled_from([frozenset(), frozenset({"z1"}), frozenset({"z2"})]),
    ), min_size=1, max_size=3))
    ports = draw(st.lists(st.sampled_from([
        EndpointPort(name=n, protocol=pr, port=tp)
        for n, _, pr in PORTS for tp in (8080, 9090)]), min_size=1, max_size=2, unique=True))
    return EndpointSlice(
        namespace="ns", name=draw(st.sampled_from(["s1", "s2", "s3"])),
        service_name=draw(st.sampled_from(NAMES)), address_type=family,
        endpoints=tuple(endpoints), ports=tuple(ports))


@dataclass(frozen=True)
class Step:
    """Set (add or update) or delete an object, or check out a snapshot."""

    action: str
    obj: Service | EndpointSlice | None = None


steps = st.lists(st.one_of(
    st.builds(Step, action=st.sampled_from(["set", "set", "delete"]),
              obj=st.one_of(services(), endpoint_slices())),
    st.just(Step(action="checkout")),
), max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=steps, later=steps)
def test_checkout_matches_a_snapshot_built_from_scratch(initial: list[Step], later: list[Step]) -> None:
    """Every checkout equals build_snapshot of the objects known then, and changed is the exact diff."""
    tracker = ChangeTracker(NODE)
    model: dict[ObjectKey, Service | EndpointSlice] = {}

    def replay(seq: list[Step]) -> set[ServicePortName]:
        union: set[ServicePortName] = set()
        for step in [*seq, Step(action="checkout")]:
            if step.action == "checkout":
                before = tracker.snapshot
                snap = tracker.checkout()
                expected = build_snapshot(
                    [o for o in model.values() if isinstance(o, Service)],
                    [o for o in model.values() if isinstance(o, EndpointSlice)], NODE)
                assert snap.same_state(expected)
                assert snap.changed == changed_names(before.ports if before else {}, snap.ports)
                union |= snap.changed
                continue
            assert step.obj is not None
            key = object_key(step.obj)
            if step.action == "delete":
                # A delete carries the last known object, or the given one when it is unknown.
                event = Event(type=EventType.DELETED, obj=model.pop(key, step.obj))
            else:
                kind = EventType.UPDATED if key in model else EventType.ADDED
                event = Event(type=kind, obj=step.obj)
                model[key] = step.obj
            tracker.apply(event)
        return union

    replay(initial)
    start = tracker.snapshot
    assert start is not None
    union = replay(later)
    end = tracker.snapshot
    assert end is not None
    assert changed_names(start.ports, end.ports) <= union
