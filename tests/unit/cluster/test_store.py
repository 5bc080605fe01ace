"""The harness API server's store: resource versions, history, 410, minimal reload changes."""

from __future__ import annotations

import pytest

from kproxy.cluster.store import ChangeType, Expired, Store
from kproxy.errors import InvalidObject


def _svc(name: str, port: int = 80) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "demo"},
            "spec": {"ports": [{"port": port}]}}


def test_every_change_takes_the_next_resource_version() -> None:
    """Create, update and delete each advance the one counter; an identical put changes nothing."""
    store = Store()
    a = store.put(_svc("a"))
    b = store.put(_svc("a", 81))
    assert a is not None and b is not None and b.rv == a.rv + 1
    assert a.type is ChangeType.ADDED and b.type is ChangeType.MODIFIED
    assert store.put(_svc("a", 81)) is None
    gone = store.delete("services", "demo", "a")
    assert gone is not None and gone.type is ChangeType.DELETED and gone.rv == b.rv + 1
    assert store.items("services")[1] == []


def test_since_replays_changes_and_expires_old_versions() -> None:
    """Changes after a version replay in order; a version before the history window is Expired."""
    store = Store(history=2)
    first = store.put(_svc("a"))
    assert first is not None
    store.put(_svc("b"))
    store.put(_svc("c"))
    with pytest.raises(Expired):
        store.since("services", first.rv - 1)
    assert [c.obj["metadata"]["name"] for c in store.since("services", first.rv)] == ["b", "c"]


def test_replace_all_yields_the_minimal_changes_and_keeps_uids() -> None:
    """A reload adds, modifies and deletes only what differs; an unchanged object keeps its
    version and uid."""
    store = Store()
    store.replace_all([_svc("a"), _svc("b")])
    uid = store.get("services", "demo", "a")["metadata"]["uid"]  # type: ignore[index]
    rv_b = store.get("services", "demo", "b")["metadata"]["resourceVersion"]  # type: ignore[index]
    changes = store.replace_all([_svc("a", 90), _svc("b"), _svc("c")])
    assert sorted((c.type.value, c.obj["metadata"]["name"]) for c in changes) == [
        ("ADDED", "c"), ("MODIFIED", "a")]
    assert store.get("services", "demo", "a")["metadata"]["uid"] == uid  # type: ignore[index]
    assert store.get("services", "demo", "b")["metadata"]["resourceVersion"] == rv_b  # type: ignore[index]
    deleted = store.replace_all([_svc("c")])
    assert {c.obj["metadata"]["name"] for c in deleted if c.type is ChangeType.DELETED} == {"a", "b"}


def test_namespaces_of_objects_exist_and_pods_default_to_running() -> None:
    """Namespaces named by objects (and default) are served; a hand-written Pod is Running and Ready."""
    store = Store()
    store.replace_all([{"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p", "namespace": "demo"},
                        "spec": {"containers": [{"name": "c"}]}}])
    assert [n["metadata"]["name"] for n in store.items("namespaces")[1]] == ["default", "demo"]
    pod = store.get("pods", "demo", "p")
    assert pod is not None and pod["status"]["phase"] == "Running"
    assert pod["status"]["conditions"] == [{"type": "Ready", "status": "True"}]


def test_unserved_kind_is_refused() -> None:
    """A kind the server does not serve raises InvalidObject naming the field."""
    with pytest.raises(InvalidObject, match="kind"):
        Store().put({"kind": "Deployment", "metadata": {"name": "d"}})
