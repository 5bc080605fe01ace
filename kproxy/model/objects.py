"""Turn API dicts of any supported kind into model objects, collecting problems.

Supported: v1 ``Service``, discovery.k8s.io/v1 ``EndpointSlice``, v1 ``Endpoints`` (converted
to slices, for older dumps), networking.k8s.io/v1 ``Ingress`` and Istio ``DestinationRule`` (for
the HTTP plane) and ``kind: List`` / ``*List`` (as ``kubectl get -o yaml`` writes).
Other kinds (Deployments, ConfigMaps ...) are ignored without error, so a whole application's
manifests can be given; a document that is not an object at all is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kproxy.errors import InvalidObject
from kproxy.model.destinationrule import DestinationRule, parse_destination_rule
from kproxy.model.endpointslice import EndpointSlice, endpoints_to_slices, parse_endpoint_slice
from kproxy.model.ingress import Ingress, parse_ingress
from kproxy.model.service import Service, parse_service

__all__ = ["KubeObject", "ParseResult", "parse_objects"]

KubeObject = Service | EndpointSlice | Ingress | DestinationRule

#: Lists nested deeper than this are reported, not followed (kubectl never nests them; this
#: keeps a hostile document from exhausting the interpreter's recursion limit).
MAX_LIST_DEPTH = 16


@dataclass(slots=True)
class ParseResult:
    """What :func:`parse_objects` found.

    Attributes:
        objects: the Services and EndpointSlices that could be served, in document order.
        problems: one :class:`InvalidObject` per object or part left out.
        ignored_kinds: kinds seen that kproxy does not read (for a debug log).
    """

    objects: list[KubeObject] = field(default_factory=list)
    problems: list[InvalidObject] = field(default_factory=list)
    ignored_kinds: list[str] = field(default_factory=list)


def parse_objects(raw: Any, *, source: str = "", where: str = "") -> ParseResult:
    """Parse one API object, or a List of them, into Services and EndpointSlices.

    Args:
        raw: a decoded document (a dict).
        source: its origin for messages (a file path, ``memory``).
        where: a prefix locating it inside the source (``document 2``, ``items[3]``).

    Returns:
        A :class:`ParseResult`; it never raises for bad input.
    """
    result = ParseResult()
    _parse_into(raw, source, where, result, 0)
    return result


def _label(where: str, raw: Mapping[str, Any]) -> str:
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    kind = raw.get("kind", "?")
    name = f"{meta.get('namespace') or 'default'}/{meta.get('name', '?')}"
    return f"{where} {kind} {name}".strip()


def _parse_into(raw: Any, source: str, where: str, result: ParseResult, depth: int) -> None:
    if raw is None:
        return  # an empty YAML document ("---" at the end of a file)
    if not isinstance(raw, Mapping):
        result.problems.append(InvalidObject(
            source=source, obj=where or "document", field="",
            problem=f"expected a Kubernetes object (a mapping), got {type(raw).__name__}"))
        return
    kind = raw.get("kind")
    if not isinstance(kind, str) or not kind:
        result.problems.append(InvalidObject(
            source=source, obj=_label(where, raw), field="kind", problem="kind is missing"))
        return
    if kind == "List" or (kind.endswith("List") and "items" in raw):
        items = raw.get("items")
        if depth >= MAX_LIST_DEPTH:
            result.problems.append(InvalidObject(
                source=source, obj=_label(where, raw), field="items",
                problem=f"lists nested more than {MAX_LIST_DEPTH} deep are not read"))
            return
        if not isinstance(items, list):
            result.problems.append(InvalidObject(
                source=source, obj=_label(where, raw), field="items",
                problem=f"expected a list, got {type(items).__name__}"))
            return
        for i, item in enumerate(items):
            item_kind = kind[: -len("List")] if kind != "List" else None
            if item_kind and isinstance(item, dict) and "kind" not in item:
                item = {**item, "kind": item_kind}  # kubectl omits kind in typed lists
            _parse_into(item, source, f"{where} items[{i}]".strip(), result, depth + 1)
        return
    try:
        if kind == "Service":
            svc, problems = parse_service(raw, source=source)
            result.objects.append(svc)
        elif kind == "EndpointSlice":
            eps, problems = parse_endpoint_slice(raw, source=source)
            result.objects.append(eps)
        elif kind == "Ingress":
            ing, problems = parse_ingress(raw, source=source)
            result.objects.append(ing)
        elif kind == "DestinationRule":
            rule, problems = parse_destination_rule(raw, source=source)
            result.objects.append(rule)
        elif kind == "Endpoints":
            slice_dicts, problems = endpoints_to_slices(raw, source=source)
            for d in slice_dicts:
                eps, more = parse_endpoint_slice(d, source=source)
                result.objects.append(eps)
                problems.extend(more)
        else:
            result.ignored_kinds.append(kind)
            return
    except InvalidObject as err:
        result.problems.append(_locate(err, where))
        return
    result.problems.extend(_locate(p, where) for p in problems)


def _locate(err: InvalidObject, where: str) -> InvalidObject:
    if not where:
        return err
    return InvalidObject(source=err.source, obj=f"{where} {err.obj}", field=err.field,
                         problem=err.problem)
