"""discovery.k8s.io/v1 EndpointSlice (and v1 Endpoints, converted), with the API's defaults.

Defaults follow ``pkg/apis/discovery/v1/defaults.go`` and the field documentation: a port's
name defaults to ``""`` and its protocol to TCP; an endpoint's ``ready`` and ``serving`` mean
true when unset and ``terminating`` false (as kube-proxy's ``endpointslicecache.go`` reads
them). An address of the wrong family for the slice's ``addressType`` is skipped with an error,
never breaking the rest (dual-stack).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kproxy.errors import InvalidObject
from kproxy.model._fields import Problems, as_bool, as_int, as_list, as_map, as_str, check_ip
from kproxy.model.names import IPFamily, NamespacedName, Protocol, family_of

__all__ = [
    "LABEL_CONVERTED_FROM_ENDPOINTS",
    "LABEL_SERVICE_NAME",
    "EndpointConditions",
    "EndpointPort",
    "EndpointSlice",
    "SliceEndpoint",
    "endpoints_to_slices",
    "parse_endpoint_slice",
]

#: discovery.LabelServiceName: the Service an EndpointSlice belongs to.
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
#: Marks the slices kproxy made from a v1 Endpoints object (see :func:`endpoints_to_slices`).
LABEL_CONVERTED_FROM_ENDPOINTS = "kproxy.dev/converted-from-endpoints"


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointConditions:
    """An endpoint's conditions after defaulting (ready, serving: true; terminating: false)."""

    ready: bool = True
    serving: bool = True
    terminating: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SliceEndpoint:
    """One entry of ``endpoints``; only ``addresses[0]`` is used, as kube-proxy does.

    Attributes:
        address: canonical ``addresses[0]``.
        conditions: ready / serving / terminating.
        node_name: ``nodeName`` or None.
        zone: ``zone`` or None.
        zone_hints: ``hints.forZones[].name``.
        node_hints: ``hints.forNodes[].name``.
    """

    address: str
    conditions: EndpointConditions = EndpointConditions()
    node_name: str | None = None
    zone: str | None = None
    zone_hints: frozenset[str] = frozenset()
    node_hints: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointPort:
    """One entry of ``ports``: a name (``""`` default), a protocol and a port number."""

    name: str
    protocol: Protocol
    port: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointSlice:
    """An EndpointSlice as kube-proxy reads it.

    Attributes:
        namespace, name: the slice's identity.
        service_name: the ``kubernetes.io/service-name`` label.
        address_type: IPv4 or IPv6 (FQDN slices are parsed with no endpoints; kube-proxy
            ignores them).
        endpoints: the valid endpoints, in object order.
        ports: the valid ports, in object order.
        labels: sorted ``(key, value)`` pairs.
        trigger_time: the ``endpoints.kubernetes.io/last-change-trigger-time`` annotation, or "".
    """

    namespace: str
    name: str
    service_name: str
    address_type: IPFamily | None
    endpoints: tuple[SliceEndpoint, ...] = ()
    ports: tuple[EndpointPort, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    trigger_time: str = ""

    @property
    def service(self) -> NamespacedName:
        """The Service this slice belongs to."""
        return NamespacedName(namespace=self.namespace, name=self.service_name)

    @property
    def converted_from_endpoints(self) -> bool:
        """True for a slice kproxy made from a v1 Endpoints object."""
        return (LABEL_CONVERTED_FROM_ENDPOINTS, "true") in self.labels


def _names(value: Any, path: str, p: Problems) -> frozenset[str]:
    out = set()
    for i, item in enumerate(as_list(value, path, p)):
        entry = as_map(item, f"{path}[{i}]", p) or {}
        name = entry.get("name")
        if isinstance(name, str) and name:
            out.add(name)
        else:
            p.add(f"{path}[{i}].name", f"expected a name, got {name!r}")
    return frozenset(out)


def _parse_endpoint(raw: Any, path: str, family: IPFamily, p: Problems) -> SliceEndpoint | None:
    entry = as_map(raw, path, p)
    if entry is None:
        return None
    addresses = as_list(entry.get("addresses"), f"{path}.addresses", p)
    if not addresses:
        p.add(f"{path}.addresses", "an endpoint needs at least one address")
        return None
    address = check_ip(addresses[0], f"{path}.addresses[0]", p)
    if address is None:
        return None
    if family_of(address) is not family:
        p.add(f"{path}.addresses[0]",
              f"{address} is not an {family} address (addressType {family}); endpoint skipped")
        return None
    cond = as_map(entry.get("conditions"), f"{path}.conditions", p) or {}
    conditions = EndpointConditions(
        ready=as_bool(cond.get("ready"), f"{path}.conditions.ready", p, True),
        serving=as_bool(cond.get("serving"), f"{path}.conditions.serving", p, True),
        terminating=as_bool(cond.get("terminating"), f"{path}.conditions.terminating", p, False),
    )
    node_name = as_str(entry.get("nodeName"), f"{path}.nodeName", p) or None
    zone = as_str(entry.get("zone"), f"{path}.zone", p) or None
    hints = as_map(entry.get("hints"), f"{path}.hints", p) or {}
    return SliceEndpoint(
        address=address, conditions=conditions, node_name=node_name, zone=zone,
        zone_hints=_names(hints.get("forZones"), f"{path}.hints.forZones", p),
        node_hints=_names(hints.get("forNodes"), f"{path}.hints.forNodes", p),
    )


def _parse_slice_port(raw: Any, path: str, p: Problems) -> EndpointPort | None:
    entry = as_map(raw, path, p)
    if entry is None:
        return None
    name = as_str(entry.get("name"), f"{path}.name", p)
    proto_text = as_str(entry.get("protocol"), f"{path}.protocol", p, default="TCP")
    try:
        protocol = Protocol(proto_text) if proto_text is not None else None
    except ValueError:
        p.add(f"{path}.protocol", f"unknown protocol {proto_text!r}; expected TCP, UDP or SCTP")
        return None
    if entry.get("port") is None:
        # kube-proxy: "Ignoring invalid endpoint port" (a nil port would mean "all ports").
        p.add(f"{path}.port", "the port number is missing")
        return None
    port = as_int(entry.get("port"), f"{path}.port", p)
    if port is not None and not 1 <= port <= 65535:
        p.add(f"{path}.port", f"port {port} is out of range 1..65535")
        return None
    if name is None or protocol is None or port is None:
        return None
    return EndpointPort(name=name, protocol=protocol, port=port)


def parse_endpoint_slice(
    raw: Mapping[str, Any], *, source: str = ""
) -> tuple[EndpointSlice, list[InvalidObject]]:
    """Parse a discovery.k8s.io/v1 EndpointSlice dict.

    Args:
        raw: the object as the API returns it.
        source: where it came from, for error messages.

    Returns:
        ``(slice, problems)``: the slice without its invalid endpoints and ports, and one
        :class:`InvalidObject` for each part left out.

    Raises:
        InvalidObject: not an EndpointSlice, no name, no ``kubernetes.io/service-name`` label,
            or an unknown ``addressType``.
    """
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    name_v = meta.get("name")
    ns_v = meta.get("namespace") or "default"
    p = Problems(obj=f"EndpointSlice {ns_v}/{name_v or '?'}", source=source)
    api = raw.get("apiVersion", "discovery.k8s.io/v1")
    if raw.get("kind") != "EndpointSlice" or api not in ("discovery.k8s.io/v1",
                                                          "discovery.k8s.io/v1beta1"):
        raise p.fail("kind", f"expected discovery.k8s.io/v1 EndpointSlice, got {api!r} "
                     f"{raw.get('kind')!r}")
    if not isinstance(name_v, str) or not name_v:
        raise p.fail("metadata.name", f"an EndpointSlice needs a name, got {name_v!r}")
    if not isinstance(ns_v, str):
        raise p.fail("metadata.namespace", f"expected a string, got {ns_v!r}")
    labels_map = as_map(meta.get("labels"), "metadata.labels", p) or {}
    service_name = labels_map.get(LABEL_SERVICE_NAME)
    if not isinstance(service_name, str) or not service_name:
        raise p.fail(f"metadata.labels[{LABEL_SERVICE_NAME}]",
                     "the label naming the owning Service is missing")
    labels = tuple(sorted((str(k), str(v)) for k, v in labels_map.items()))
    annotations = as_map(meta.get("annotations"), "metadata.annotations", p) or {}
    trigger = annotations.get("endpoints.kubernetes.io/last-change-trigger-time", "")
    addr_type = raw.get("addressType")
    if addr_type == "FQDN":
        return EndpointSlice(namespace=ns_v, name=name_v, service_name=service_name,
                             address_type=None, labels=labels), p.errors
    try:
        family = IPFamily(str(addr_type))
    except ValueError:
        raise p.fail("addressType", f"expected IPv4, IPv6 or FQDN, got {addr_type!r}") from None
    endpoints = tuple(
        ep for i, e in enumerate(as_list(raw.get("endpoints"), "endpoints", p))
        if (ep := _parse_endpoint(e, f"endpoints[{i}]", family, p)) is not None
    )
    ports = tuple(
        port for i, e in enumerate(as_list(raw.get("ports"), "ports", p))
        if (port := _parse_slice_port(e, f"ports[{i}]", p)) is not None
    )
    return EndpointSlice(
        namespace=ns_v, name=name_v, service_name=service_name, address_type=family,
        endpoints=endpoints, ports=ports, labels=labels,
        trigger_time=trigger if isinstance(trigger, str) else "",
    ), p.errors


def endpoints_to_slices(
    raw: Mapping[str, Any], *, source: str = ""
) -> tuple[list[dict[str, Any]], list[InvalidObject]]:
    """Convert a v1 Endpoints dict into EndpointSlice dicts, as the mirroring controller does.

    Each subset becomes one slice per address family, named ``<name>-<subset>-<family>``:
    ``addresses`` are ready, ``notReadyAddresses`` not ready (``endpointslicemirroring``
    sets only ``ready``); ``nodeName`` is kept. The slices carry the label
    :data:`LABEL_CONVERTED_FROM_ENDPOINTS`: kube-proxy reads only EndpointSlices, so when a
    Service has real EndpointSlices too (``kubectl get svc,ep,endpointslices`` dumps hold
    both) the converted ones are ignored (see :func:`kproxy.model.build_service_ports`).

    Returns:
        ``(slice_dicts, problems)``; parse each dict with :func:`parse_endpoint_slice`.

    Raises:
        InvalidObject: not a v1 Endpoints object, or no name.
    """
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    name_v = meta.get("name")
    ns_v = meta.get("namespace") or "default"
    p = Problems(obj=f"Endpoints {ns_v}/{name_v or '?'}", source=source)
    if raw.get("kind") != "Endpoints" or raw.get("apiVersion", "v1") != "v1":
        raise p.fail("kind", f"expected v1 Endpoints, got {raw.get('kind')!r}")
    if not isinstance(name_v, str) or not name_v:
        raise p.fail("metadata.name", f"Endpoints need a name, got {name_v!r}")
    slices: list[dict[str, Any]] = []
    for s, subset in enumerate(as_list(raw.get("subsets"), "subsets", p)):
        sub = as_map(subset, f"subsets[{s}]", p) or {}
        by_family: dict[str, list[dict[str, Any]]] = {}
        for key, ready in (("addresses", True), ("notReadyAddresses", False)):
            for i, addr in enumerate(as_list(sub.get(key), f"subsets[{s}].{key}", p)):
                entry = as_map(addr, f"subsets[{s}].{key}[{i}]", p) or {}
                ip = check_ip(entry.get("ip"), f"subsets[{s}].{key}[{i}].ip", p)
                if ip is None:
                    continue
                ep: dict[str, Any] = {"addresses": [ip], "conditions": {"ready": ready}}
                if isinstance(entry.get("nodeName"), str):
                    ep["nodeName"] = entry["nodeName"]
                by_family.setdefault(str(family_of(ip)), []).append(ep)
        ports = [dict(port) for port in as_list(sub.get("ports"), f"subsets[{s}].ports", p)
                 if isinstance(port, Mapping)]
        for family, eps in sorted(by_family.items()):
            slices.append({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": f"{name_v}-{s}-{family.lower()}", "namespace": ns_v,
                             "labels": {LABEL_SERVICE_NAME: name_v,
                                        LABEL_CONVERTED_FROM_ENDPOINTS: "true"}},
                "addressType": family, "endpoints": eps, "ports": ports,
            })
    return slices, p.errors
