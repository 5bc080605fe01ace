"""The change tracker: folding events per Service and incremental Snapshots."""

from __future__ import annotations

import pytest

from kproxy.errors import InvalidArgument
from kproxy.model import NodeConfig, ServicePortName, build_snapshot
from kproxy.sync import ChangeTracker
from tests.unit.sync.builders import added, addresses, deleted, eps, svc, updated

NODE = NodeConfig(hostname="node-a")
WEB = ServicePortName(namespace="default", name="web")
API = ServicePortName(namespace="default", name="api")


def test_first_checkout_has_every_port_changed() -> None:
    """The first Snapshot is revision 1 and names every port as changed."""
    t = ChangeTracker(NODE)
    t.apply_all([added(svc("web")), added(svc("api", "10.0.0.2")),
                 added(eps("web-1", "web", ["10.1.0.1"]))])
    snap = t.checkout()
    assert snap.revision == 1
    assert snap.changed == {WEB, API}
    assert addresses(snap, "default/web") == ["10.1.0.1:8080"]


def test_add_then_delete_nets_to_nothing() -> None:
    """A Service added and deleted between checkouts leaves nothing pending and nothing changed."""
    t = ChangeTracker(NODE)
    t.checkout()
    t.apply(added(svc("web")))
    t.apply(added(eps("web-1", "web", ["10.1.0.1"])))
    assert t.pending_count == 1
    t.apply(deleted(svc("web")))
    t.apply(deleted(eps("web-1", "web", ["10.1.0.1"])))
    assert t.pending_count == 0
    snap = t.checkout()
    assert snap.revision == 2 and snap.changed == frozenset() and len(snap) == 0


def test_update_back_to_the_previous_state_is_a_no_op() -> None:
    """Changing a slice and changing it back drops the pending change."""
    t = ChangeTracker(NODE)
    t.apply_all([added(svc("web")), added(eps("web-1", "web", ["10.1.0.1"]))])
    t.checkout()
    t.apply(updated(eps("web-1", "web", ["10.1.0.9"])))
    t.apply(updated(eps("web-1", "web", ["10.1.0.1"])))
    assert t.pending_count == 0


def test_slice_moving_to_another_service_updates_both() -> None:
    """A slice relabelled from web to api leaves web without endpoints and gives them to api."""
    t = ChangeTracker(NODE)
    t.apply_all([added(svc("web")), added(svc("api", "10.0.0.2")),
                 added(eps("s1", "web", ["10.1.0.1"]))])
    t.checkout()
    t.apply(updated(eps("s1", "api", ["10.1.0.1"])))
    assert t.pending_count == 2
    snap = t.checkout()
    assert snap.changed == {WEB, API}
    assert addresses(snap, "default/web") == []
    assert addresses(snap, "default/api") == ["10.1.0.1:8080"]


def test_duplicate_endpoints_across_slices_are_one_endpoint() -> None:
    """The same ip:port in two slices of a Service is one endpoint, the ready copy preferred."""
    t = ChangeTracker(NODE)
    t.apply_all([added(svc("web")), added(eps("s1", "web", ["10.1.0.1"], ready=False)),
                 added(eps("s2", "web", ["10.1.0.1", "10.1.0.2"]))])
    snap = t.checkout()
    info = snap.get("default/web")
    assert info is not None
    assert [(e.address, e.ready) for e in info.endpoints] == [("10.1.0.1:8080", True),
                                                              ("10.1.0.2:8080", True)]


def test_unchanged_services_keep_their_port_infos() -> None:
    """Only pending Services are rebuilt: the others keep the very same ServicePortInfo objects."""
    t = ChangeTracker(NODE)
    t.apply_all([added(svc("web")), added(svc("api", "10.0.0.2"))])
    first = t.checkout()
    t.apply(added(eps("s1", "web", ["10.1.0.1"])))
    second = t.checkout()
    assert second.changed == {WEB}
    assert second.get(API) is first.get(API)
    assert second.same_state(build_snapshot(t.services(), t.endpoint_slices(), NODE))


def test_change_that_does_not_alter_ports_is_not_in_changed() -> None:
    """A slice whose port matches no service port leaves the Service pending but unchanged."""
    t = ChangeTracker(NODE)
    t.apply(added(svc("web")))
    t.checkout()
    t.apply(added(eps("s1", "web", ["10.1.0.1"], port_name="other")))
    assert t.pending_count == 1
    assert t.checkout().changed == frozenset()


def test_deleted_service_is_removed_and_changed() -> None:
    """Deleting a Service removes its ports and names them in changed."""
    t = ChangeTracker(NODE)
    t.apply_all([added(svc("web")), added(eps("s1", "web", ["10.1.0.1"]))])
    t.checkout()
    t.apply(deleted(svc("web")))
    snap = t.checkout()
    assert snap.changed == {WEB} and snap.get(WEB) is None


def test_pending_changes_record_when_they_were_first_queued() -> None:
    """Each pending Service remembers its first change time; checkout clears them."""
    now = [10.0]
    t = ChangeTracker(NODE, now=lambda: now[0])
    t.apply(added(svc("web")))
    now[0] = 12.0
    t.apply(updated(svc("web", "10.0.0.9")))
    t.apply(added(svc("api", "10.0.0.2")))
    assert t.oldest_pending_since() == 10.0
    assert [(str(p.service), p.queued_at) for p in t.pending()] == [("default/web", 10.0),
                                                                   ("default/api", 12.0)]
    t.checkout()
    assert t.oldest_pending_since() is None


def test_skipped_services_have_no_ports() -> None:
    """A Service kube-proxy skips (no cluster IP) is tracked but has no ports in the Snapshot."""
    t = ChangeTracker(NODE)
    headless = svc("web").__class__(namespace="default", name="web", headless=True)
    t.apply(added(headless))
    assert len(t.checkout()) == 0


def test_apply_rejects_non_events() -> None:
    """Passing a bare object instead of an Event raises InvalidArgument."""
    with pytest.raises(InvalidArgument, match="expected an Event"):
        ChangeTracker(NODE).apply(svc("web"))  # type: ignore[arg-type]
