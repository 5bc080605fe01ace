"""The harness API server's object store: resources, resource versions, history (sans-IO).

Theory of operation
-------------------
One counter gives every change the next resource version, as etcd's revision does for the whole
cluster. The store keeps each object (as JSON-ready dicts, with ``metadata.resourceVersion``,
``uid`` and ``creationTimestamp`` filled in as the API server would) and a bounded history of
changes; a watch from version R replays the changes after R, and R older than the history
window is ``410 Gone`` (:class:`Expired`), as the watch cache answers. :meth:`Store.replace_all`
turns a fresh read of the manifests into the minimal ADDED/MODIFIED/DELETED changes, so a live
reload looks to clients like edits made through the API.

Defaults for objects written by hand: a Pod without ``status.phase`` is ``Running`` and Ready
(what a harness pod is), Namespaces named by any object exist (``default`` too).
"""

from __future__ import annotations

import copy
import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kproxy.errors import InvalidObject
from kproxy.errors import VersionExpired as Expired

__all__ = ["RESOURCES", "Change", "ChangeType", "Expired", "Resource", "Store", "resource_of_kind"]

# Changes kept for watches; older versions are 410 Gone (the watch cache keeps ~100 per
# resource by default; more here, since a harness replays bursts).
HISTORY = 10_000
_CREATED = "2026-01-01T00:00:00Z"


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """One served resource: its plural ``name``, ``kind``, API group and version, scope."""

    name: str
    kind: str
    group: str
    version: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    singular: str = ""

    @property
    def api_version(self) -> str:
        """``v1`` or ``group/version``."""
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES: Mapping[str, Resource] = {
    r.name: r for r in (
        Resource(name="namespaces", kind="Namespace", group="", version="v1", namespaced=False,
                 short_names=("ns",), singular="namespace"),
        Resource(name="services", kind="Service", group="", version="v1", namespaced=True,
                 short_names=("svc",), singular="service"),
        Resource(name="pods", kind="Pod", group="", version="v1", namespaced=True,
                 short_names=("po",), singular="pod"),
        Resource(name="nodes", kind="Node", group="", version="v1", namespaced=False,
                 short_names=("no",), singular="node"),
        Resource(name="endpointslices", kind="EndpointSlice", group="discovery.k8s.io", version="v1",
                 namespaced=True, singular="endpointslice"),
    )
}


def resource_of_kind(kind: str) -> Resource | None:
    """The resource serving ``kind`` (``Service`` -> services), or ``None``."""
    return next((r for r in RESOURCES.values() if r.kind == kind), None)


class ChangeType(enum.Enum):
    """Watch event types."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One change at resource version ``rv``: the object after it (before it, for DELETED), and
    the object before it (``None`` for ADDED), so a watch can tell entering and leaving a selector."""

    rv: int
    type: ChangeType
    resource: str
    obj: Mapping[str, Any]
    old: Mapping[str, Any] | None = None


Key = tuple[str, str, str]


def _key(obj: Mapping[str, Any]) -> tuple[Resource, Key]:
    kind = obj.get("kind")
    res = resource_of_kind(kind) if isinstance(kind, str) else None
    meta = obj.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if res is None or not isinstance(name, str) or not name:
        kinds = sorted(r.kind for r in RESOURCES.values())
        raise InvalidObject(obj=f"{kind} {name}", field="kind" if res is None else "metadata.name",
                            problem=f"not a served object (kinds: {kinds})")
    ns = meta.get("namespace") or "default" if res.namespaced else ""
    return res, (res.name, str(ns), name)


def _normalise(obj: Mapping[str, Any], res: Resource, key: Key) -> dict[str, Any]:
    out = copy.deepcopy(dict(obj))
    out["apiVersion"] = res.api_version
    meta = out.setdefault("metadata", {})
    if res.namespaced:
        meta["namespace"] = key[1]
    meta.pop("resourceVersion", None)
    meta.setdefault("uid", hashlib.sha1("/".join(key).encode()).hexdigest()[:8] + "-harness")
    meta.setdefault("creationTimestamp", _CREATED)
    if res.kind == "Pod":
        status = out.setdefault("status", {})
        status.setdefault("phase", "Running")
        if status["phase"] == "Running":
            status.setdefault("conditions", [{"type": "Ready", "status": "True"}])
            spec = out.setdefault("spec", {})
            names = [c.get("name", "") for c in spec.get("containers", []) if isinstance(c, Mapping)]
            status.setdefault("containerStatuses", [
                {"name": n, "ready": True, "restartCount": 0, "state": {"running": {"startedAt": _CREATED}}}
                for n in names])
    if res.kind == "Namespace":
        out.setdefault("status", {"phase": "Active"})
    return out


class Store:
    """Objects by resource, namespace and name, with one resource-version counter and history."""

    def __init__(self, *, history: int = HISTORY) -> None:
        self.rv = 1
        self._objects: dict[Key, dict[str, Any]] = {}
        self._history: list[Change] = []
        self._limit = history
        self.compacted_rv = 1

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object (a deep copy), or ``None``."""
        obj = self._objects.get((resource, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def items(self, resource: str, namespace: str | None = None) -> tuple[int, list[dict[str, Any]]]:
        """``(resource version, objects)`` of ``resource`` (in ``namespace``, or all), by key."""
        items = [copy.deepcopy(o) for k, o in sorted(self._objects.items())
                 if k[0] == resource and (namespace is None or k[1] == namespace)]
        return self.rv, items

    def since(self, resource: str, rv: int) -> list[Change]:
        """The changes of ``resource`` after ``rv``, oldest first.

        Raises:
            VersionExpired: ``rv`` is older than the history kept (the client must relist).
        """
        if rv < self.compacted_rv:
            raise Expired(f"too old resource version: {rv} ({self.compacted_rv})")
        return [c for c in self._history if c.rv > rv and c.resource == resource]

    def compact(self) -> None:
        """Forget all history (tests of 410: every older watch version is now Expired)."""
        self._history.clear()
        self.compacted_rv = self.rv

    def _record(self, change: Change) -> Change:
        self._history.append(change)
        if len(self._history) > self._limit:
            dropped = self._history[: len(self._history) - self._limit]
            del self._history[: len(dropped)]
            self.compacted_rv = dropped[-1].rv
        return change

    def put(self, obj: Mapping[str, Any]) -> Change | None:
        """Create or update ``obj`` (a manifest dict); ``None`` when nothing changed.

        Raises:
            InvalidObject: not a served kind, or no name.
        """
        res, key = _key(obj)
        new = _normalise(obj, res, key)
        old = self._objects.get(key)
        if old is not None:
            new["metadata"]["uid"] = old["metadata"]["uid"]
            stripped = copy.deepcopy(old)
            stripped["metadata"].pop("resourceVersion", None)
            if json.dumps(stripped, sort_keys=True) == json.dumps(new, sort_keys=True):
                return None
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        self._objects[key] = new
        kind = ChangeType.MODIFIED if old is not None else ChangeType.ADDED
        return self._record(Change(rv=self.rv, type=kind, resource=res.name, obj=copy.deepcopy(new), old=old))

    def delete(self, resource: str, namespace: str, name: str) -> Change | None:
        """Delete one object; ``None`` when it did not exist."""
        old = self._objects.pop((resource, namespace, name), None)
        if old is None:
            return None
        self.rv += 1
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        return self._record(Change(rv=self.rv, type=ChangeType.DELETED, resource=resource, obj=gone, old=old))

    def replace_all(self, objects: Iterable[Mapping[str, Any]]) -> list[Change]:
        """Make the store hold exactly ``objects`` (plus their Namespaces and ``default``);
        returns the changes, in order. Invalid objects raise before anything changes.

        Raises:
            InvalidObject: an object of a kind not served, or without a name.
        """
        wanted: dict[Key, Mapping[str, Any]] = {}
        for obj in objects:
            _, key = _key(obj)
            wanted[key] = obj
        for ns in {k[1] for k in wanted if k[1]} | {"default"}:
            wanted.setdefault(("namespaces", "", ns), {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": ns}})
        changes = [c for key in sorted(self._objects) if key not in wanted
                   if (c := self.delete(*key)) is not None]
        changes += [c for key in sorted(wanted) if (c := self.put(wanted[key])) is not None]
        return changes
