"""The API's documents, as pure functions: discovery, lists, Tables, Status, selectors, /version.

Shapes follow the real API server's JSON (k8s.io/apimachinery meta/v1 types): ``APIVersions``,
``APIGroupList``, ``APIResourceList`` (legacy discovery), ``APIGroupDiscoveryList`` (aggregated
discovery, ``apidiscovery.k8s.io/v2``, which kubectl 1.30+ asks for first), ``Table``
(``meta.k8s.io/v1``, which ``kubectl get`` asks for), and ``Status`` for errors.
Selectors: the label selector grammar (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``,
``a in (x,y)``, ``a notin (x)``) and field selectors on ``metadata.name``,
``metadata.namespace`` and ``spec.clusterIP`` with ``=``, ``==`` and ``!=``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from kproxy.cluster.store import RESOURCES, Resource
from kproxy.errors import InvalidArgument

__all__ = [
    "AGGREGATED_V2",
    "AGGREGATED_V2BETA1",
    "aggregated_discovery",
    "api_group_list",
    "api_resource_list",
    "api_versions",
    "field_matcher",
    "label_matcher",
    "list_document",
    "status_document",
    "table_document",
    "version_document",
]

AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
_VERBS = ["get", "list", "watch"]
Obj = Mapping[str, Any]


def version_document(minor: int) -> dict[str, str]:
    """``/version`` for Kubernetes 1.``minor`` (``/usr/bin/kubectl`` picks its binary by it)."""
    return {"major": "1", "minor": str(minor), "gitVersion": f"v1.{minor}.0", "gitCommit": "kproxy",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.22",
            "compiler": "gc", "platform": "linux/amd64"}


def api_versions() -> dict[str, Any]:
    """``/api``: the legacy group's versions."""
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}


def _groups() -> dict[str, str]:
    return {r.group: r.version for r in RESOURCES.values() if r.group}


def api_group_list() -> dict[str, Any]:
    """``/apis``: the named groups."""
    groups = []
    for group, version in sorted(_groups().items()):
        gv = {"groupVersion": f"{group}/{version}", "version": version}
        groups.append({"name": group, "versions": [gv], "preferredVersion": gv})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _resource_entry(r: Resource) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": r.name, "singularName": r.singular, "namespaced": r.namespaced,
                             "kind": r.kind, "verbs": _VERBS}
    if r.short_names:
        entry["shortNames"] = list(r.short_names)
    return entry


def api_resource_list(group: str, version: str) -> dict[str, Any] | None:
    """``/api/v1`` or ``/apis/GROUP/VERSION``; ``None`` for a group version not served."""
    served = [r for r in RESOURCES.values() if r.group == group and r.version == version]
    if not served:
        return None
    entries = [_resource_entry(r) for r in served]
    if group == "":
        entries.append({"name": "pods/portforward", "singularName": "", "namespaced": True,
                        "kind": "PodPortForwardOptions", "verbs": ["create", "get"]})
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": entries}


def aggregated_discovery(legacy: bool, api_version: str) -> dict[str, Any]:
    """The aggregated document of ``/api`` (``legacy``) or ``/apis``, in ``apidiscovery.k8s.io``
    ``api_version`` (``v2`` or ``v2beta1``)."""
    by_group: dict[str, list[Resource]] = {}
    for r in RESOURCES.values():
        if (r.group == "") == legacy:
            by_group.setdefault(r.group, []).append(r)
    items = []
    for group, resources in sorted(by_group.items()):
        entries = []
        for r in resources:
            entry: dict[str, Any] = {
                "resource": r.name, "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
                "scope": "Namespaced" if r.namespaced else "Cluster", "singularResource": r.singular,
                "verbs": _VERBS}
            if r.short_names:
                entry["shortNames"] = list(r.short_names)
            if r.name == "pods":
                entry["subresources"] = [{"subresource": "portforward", "verbs": ["create", "get"],
                                          "responseKind": {"group": "", "version": "v1",
                                                           "kind": "PodPortForwardOptions"}}]
            entries.append(entry)
        items.append({"metadata": {"name": group, "creationTimestamp": None},
                      "versions": [{"version": resources[0].version, "resources": entries,
                                    "freshness": "Current"}]})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": f"apidiscovery.k8s.io/{api_version}",
            "metadata": {}, "items": items}


def status_document(code: int, reason: str, message: str, *, details: Mapping[str, Any] | None = None
                    ) -> dict[str, Any]:
    """A ``Status`` failure, e.g. ``(404, "NotFound", 'pods "x" not found')``."""
    doc: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": message, "reason": reason, "code": code}
    if details:
        doc["details"] = dict(details)
    return doc


def list_document(res: Resource, rv: int, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``<Kind>List``; items keep ``kind`` and ``apiVersion`` out, as the real server writes them."""
    bare = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]
    return {"kind": f"{res.kind}List", "apiVersion": res.api_version,
            "metadata": {"resourceVersion": str(rv)}, "items": bare}


def _cols(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "type": "string", "format": "name" if n == "Name" else "", "description": "",
             "priority": 0} for n in names]


def _pod_row(o: Obj) -> list[Any]:
    statuses = o.get("status", {}).get("containerStatuses", []) or []
    containers = o.get("spec", {}).get("containers", []) or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    return [o["metadata"]["name"], f"{ready}/{len(containers)}", o.get("status", {}).get("phase", ""),
            restarts, "<unknown>"]


def _svc_row(o: Obj) -> list[Any]:
    spec = o.get("spec", {})
    ports = ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports", []) or [])
    return [o["metadata"]["name"], spec.get("type", "ClusterIP"), spec.get("clusterIP", "<none>"), "<none>",
            ports or "<none>", "<unknown>"]


def _slice_row(o: Obj) -> list[Any]:
    ports = ",".join(str(p.get("port")) for p in o.get("ports", []) or []) or "<unset>"
    addrs = [a for e in o.get("endpoints", []) or [] for a in e.get("addresses", [])]
    shown = ",".join(addrs[:3]) + (f" + {len(addrs) - 3} more..." if len(addrs) > 3 else "")
    return [o["metadata"]["name"], o.get("addressType", ""), ports, shown or "<unset>", "<unknown>"]


def _name_row(o: Obj) -> list[Any]:
    return [o["metadata"]["name"], "<unknown>"]


_TABLES: Mapping[str, tuple[list[dict[str, Any]], Callable[[Obj], list[Any]]]] = {
    "pods": (_cols("Name", "Ready", "Status", "Restarts", "Age"), _pod_row),
    "services": (_cols("Name", "Type", "Cluster-IP", "External-IP", "Port(s)", "Age"), _svc_row),
    "endpointslices": (_cols("Name", "AddressType", "Ports", "Endpoints", "Age"), _slice_row),
}


def table_document(res: Resource, rv: int, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` ``Table`` of ``items`` with kubectl's columns for the kind (Name and
    Age for kinds without their own), each row carrying its object."""
    columns, row = _TABLES.get(res.name, (_cols("Name", "Age"), _name_row))
    rows = [{"cells": row(o), "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                         "metadata": o["metadata"]}} for o in items]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(rv)},
            "columnDefinitions": columns, "rows": rows}


_REQ = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*"
                  r"(?:(==|=|!=)\s*([A-Za-z0-9_.-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def _requirement(neg: str, key: str, op: str | None, value: str | None, setop: str | None,
                 values: str | None) -> Callable[[Mapping[str, str]], bool]:
    if op in ("=", "=="):
        return lambda ls: ls.get(key) == value
    if op == "!=":
        return lambda ls: ls.get(key) != value
    if setop:
        options = {v.strip() for v in (values or "").split(",") if v.strip()}
        if setop == "in":
            return lambda ls: ls.get(key) in options
        return lambda ls: ls.get(key) not in options
    if neg:
        return lambda ls: key not in ls
    return lambda ls: key in ls


def _field_check(get: Callable[[Obj], str], op: str, value: str) -> Callable[[Obj], bool]:
    if op == "!=":
        return lambda o: get(o) != value
    return lambda o: get(o) == value


def label_matcher(selector: str) -> Callable[[Obj], bool]:
    """A predicate for a label selector string (empty: everything).

    Raises:
        InvalidArgument: a requirement that does not parse (the API's 400 BadRequest).
    """
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for part in _split_selector(selector):
        m = _REQ.match(part)
        if m is None or (m.group(1) and (m.group(3) or m.group(5))):
            raise InvalidArgument(f"unable to parse requirement: {part!r}")
        checks.append(_requirement(*m.groups()))

    def match(obj: Obj) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(check(labels) for check in checks)

    return match


_FIELDS: Mapping[str, Callable[[Obj], str]] = {
    "metadata.name": lambda o: str(o.get("metadata", {}).get("name", "")),
    "metadata.namespace": lambda o: str(o.get("metadata", {}).get("namespace", "")),
    "spec.clusterIP": lambda o: str(o.get("spec", {}).get("clusterIP", "")),
    "spec.nodeName": lambda o: str(o.get("spec", {}).get("nodeName", "")),
    "status.phase": lambda o: str(o.get("status", {}).get("phase", "")),
}


def field_matcher(selector: str) -> Callable[[Obj], bool]:
    """A predicate for a field selector string (empty: everything).

    Raises:
        InvalidArgument: an unsupported field or operator (the API's 400 BadRequest).
    """
    checks: list[Callable[[Obj], bool]] = []
    for part in (p for p in selector.split(",") if p.strip()):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if m is None or m.group(1) not in _FIELDS:
            raise InvalidArgument(f'field label not supported: "{part}"')
        checks.append(_field_check(_FIELDS[m.group(1)], m.group(2), m.group(3)))
    return lambda obj: all(check(obj) for check in checks)
