"""networking.k8s.io/v1 Ingress, parsed and validated as the API server validates it.

Validation follows ``pkg/apis/networking/validation`` (``ValidateIngressSpec``): a rule host is
a DNS-1123 subdomain or a wildcard ``*.`` plus one, never an IP; an HTTP path has a
``pathType`` of ``Exact``, ``Prefix`` or ``ImplementationSpecific`` and, for the first two, an
absolute path; a backend names a Service and exactly one of ``port.number`` (1..65535) and
``port.name``. As for Services, the smallest wrong part (a path, a rule) is reported with its
file, object and field and left out, and the rest is served; ``resource`` backends are reported
(kproxy serves Services only).

The class (:attr:`Ingress.ingress_class`) is the legacy annotation ``kubernetes.io/ingress.class``
when present, else ``spec.ingressClassName``, as ingress-nginx reads them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kproxy.errors import InvalidObject
from kproxy.model._fields import Problems, as_int, as_list, as_map, as_str
from kproxy.model.names import NamespacedName

__all__ = [
    "INGRESS_CLASS_ANNOTATION",
    "HTTPIngressPath",
    "Ingress",
    "IngressBackend",
    "IngressRule",
    "PathType",
    "parse_ingress",
]

#: The legacy class annotation ingress-nginx still honours.
INGRESS_CLASS_ANNOTATION = "kubernetes.io/ingress.class"
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_IPV4ISH = re.compile(r"^[0-9.]+$")


class PathType(StrEnum):
    """``HTTPIngressPath.pathType``."""

    Exact = "Exact"
    Prefix = "Prefix"
    ImplementationSpecific = "ImplementationSpecific"


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressBackend:
    """``IngressServiceBackend``: a Service and one of its ports by number or by name.

    Attributes:
        service: the Service's name (same namespace as the Ingress).
        port_number: the Service port number, or None when named.
        port_name: the Service port name, or None when numbered.
    """

    service: str
    port_number: int | None = None
    port_name: str | None = None

    @property
    def port(self) -> int | str:
        """The port as ingress-nginx names upstreams: the number, else the name."""
        return self.port_number if self.port_number is not None else (self.port_name or "")


@dataclass(frozen=True, slots=True, kw_only=True)
class HTTPIngressPath:
    """One ``rules[].http.paths[]`` entry.

    Attributes:
        path: the path (``/`` when empty with ImplementationSpecific).
        path_type: Exact, Prefix or ImplementationSpecific.
        backend: where it goes.
    """

    path: str
    path_type: PathType
    backend: IngressBackend


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressRule:
    """One ``spec.rules[]`` entry.

    Attributes:
        host: the host, ``""`` for any host, or a wildcard ``*.example.com``.
        paths: its HTTP paths, in spec order.
    """

    host: str
    paths: tuple[HTTPIngressPath, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Ingress:
    """A networking.k8s.io/v1 Ingress.

    Attributes:
        namespace, name: the object's identity.
        ingress_class: the class (annotation, else ``spec.ingressClassName``), or None.
        annotations: sorted ``(key, value)`` pairs.
        default_backend: ``spec.defaultBackend`` or None.
        rules: the valid rules, in spec order.
        creation_timestamp: ``metadata.creationTimestamp`` text (ingress-nginx orders Ingresses
            by it), ``""`` when unset.
        source: where it came from, for messages (not compared).
    """

    namespace: str
    name: str
    ingress_class: str | None = None
    annotations: tuple[tuple[str, str], ...] = ()
    default_backend: IngressBackend | None = None
    rules: tuple[IngressRule, ...] = ()
    creation_timestamp: str = ""
    source: str = field(default="", compare=False)

    @property
    def key(self) -> NamespacedName:
        """``namespace/name``."""
        return NamespacedName(namespace=self.namespace, name=self.name)

    def annotation_map(self) -> dict[str, str]:
        """The annotations as a dict."""
        return dict(self.annotations)


def _check_host(host: str, path: str, p: Problems) -> bool:
    body = host[2:] if host.startswith("*.") else host
    if _IPV4ISH.match(host) or ":" in host:
        p.add(path, f"must be a DNS name, not an IP address: {host!r}")
        return False
    if len(host) > 253 or not _DNS1123_SUBDOMAIN.match(body):
        p.add(path, f"a lowercase RFC 1123 subdomain (or a wildcard '*.' plus one) is expected: {host!r}")
        return False
    return True


def _parse_backend(raw: Any, path: str, p: Problems) -> IngressBackend | None:
    before = len(p.errors)
    spec = as_map(raw, path, p)
    if spec is None:
        if len(p.errors) == before:
            p.add(path, "a backend is required")
        return None
    if "resource" in spec:
        p.add(f"{path}.resource", "resource backends are not served (only Service backends)")
        return None
    svc = as_map(spec.get("service"), f"{path}.service", p)
    if svc is None:
        if len(p.errors) == before:
            p.add(f"{path}.service", "a service backend is required")
        return None
    name = as_str(svc.get("name"), f"{path}.service.name", p)
    if name is not None and not name:
        p.add(f"{path}.service.name", "the Service name is required")
    port = as_map(svc.get("port"), f"{path}.service.port", p) or {}
    number = port.get("number")
    port_name = port.get("name")
    if (number is None) == (port_name in (None, "")):
        p.add(f"{path}.service.port", f"exactly one of number and name is required: {dict(port)!r}")
    elif number is not None:
        number = as_int(number, f"{path}.service.port.number", p)
        if number is not None and not 1 <= number <= 65535:
            p.add(f"{path}.service.port.number", f"must be between 1 and 65535: {number}")
    else:
        port_name = as_str(port_name, f"{path}.service.port.name", p)
    if len(p.errors) != before or not name:
        return None
    return IngressBackend(service=name, port_number=number if number is not None else None,
                          port_name=port_name if number is None else None)


def _parse_path(raw: Any, path: str, p: Problems) -> HTTPIngressPath | None:
    before = len(p.errors)
    spec = as_map(raw, path, p)
    if spec is None:
        return None
    text = as_str(spec.get("path"), f"{path}.path", p)
    type_text = as_str(spec.get("pathType"), f"{path}.pathType", p)
    path_type = None
    if type_text is not None:
        try:
            path_type = PathType(type_text)
        except ValueError:
            p.add(f"{path}.pathType", f"must be Exact, Prefix or ImplementationSpecific: {type_text!r}")
    if text is not None and path_type is not None:
        if path_type is not PathType.ImplementationSpecific and not text.startswith("/"):
            p.add(f"{path}.path", f"must be an absolute path for {path_type}: {text!r}")
        elif path_type is PathType.ImplementationSpecific and text and not text.startswith("/"):
            p.add(f"{path}.path", f"must be an absolute path: {text!r}")
    backend = _parse_backend(spec.get("backend"), f"{path}.backend", p)
    if len(p.errors) != before or backend is None or path_type is None or text is None:
        return None
    return HTTPIngressPath(path=text or "/", path_type=path_type, backend=backend)


def _parse_rules(spec: Mapping[str, Any], p: Problems) -> tuple[IngressRule, ...]:
    rules: list[IngressRule] = []
    for i, raw in enumerate(as_list(spec.get("rules"), "spec.rules", p)):
        rpath = f"spec.rules[{i}]"
        rule = as_map(raw, rpath, p)
        if rule is None:
            continue
        host = as_str(rule.get("host"), f"{rpath}.host", p)
        if host is None or (host and not _check_host(host, f"{rpath}.host", p)):
            continue
        http = as_map(rule.get("http"), f"{rpath}.http", p) or {}
        paths = [hp for j, raw_path in enumerate(as_list(http.get("paths"), f"{rpath}.http.paths", p))
                 if (hp := _parse_path(raw_path, f"{rpath}.http.paths[{j}]", p)) is not None]
        rules.append(IngressRule(host=host, paths=tuple(paths)))
    return tuple(rules)


def parse_ingress(raw: Mapping[str, Any], *, source: str = "") -> tuple[Ingress, list[InvalidObject]]:
    """Parse one Ingress, keeping its valid rules and paths.

    Args:
        raw: the decoded object.
        source: where it came from (a file path, ``memory``, ``kube``).

    Returns:
        The Ingress and one problem per part left out.

    Raises:
        InvalidObject: the object cannot be served at all (no name, a spec that is no object,
            an API version other than networking.k8s.io/v1, or neither rules nor a default
            backend left).
    """
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    namespace = meta.get("namespace") or "default"
    name = meta.get("name")
    p = Problems(obj=f"Ingress {namespace}/{name or '?'}", source=source)
    if not isinstance(name, str) or not name:
        raise p.fail("metadata.name", "the name is missing")
    if not isinstance(namespace, str):
        raise p.fail("metadata.namespace", f"expected a string, got {namespace!r}")
    api = raw.get("apiVersion")
    if api != "networking.k8s.io/v1":
        raise p.fail("apiVersion", f"expected networking.k8s.io/v1, got {api!r}")
    spec = as_map(raw.get("spec"), "spec", p)
    if spec is None:
        raise p.errors[-1] if p.errors else p.fail("spec", "the spec is missing")
    raw_annotations = as_map(meta.get("annotations"), "metadata.annotations", p) or {}
    annotations = tuple(sorted((str(k), str(v)) for k, v in raw_annotations.items()
                               if isinstance(v, str)))
    class_name = as_str(spec.get("ingressClassName"), "spec.ingressClassName", p, default="") or None
    ingress_class = dict(annotations).get(INGRESS_CLASS_ANNOTATION) or class_name
    default_backend = None
    if spec.get("defaultBackend") is not None:
        default_backend = _parse_backend(spec.get("defaultBackend"), "spec.defaultBackend", p)
    rules = _parse_rules(spec, p)
    if not rules and default_backend is None:
        raise p.errors[0] if p.errors else p.fail("spec", "neither rules nor a defaultBackend")
    created = meta.get("creationTimestamp")
    ingress = Ingress(namespace=namespace, name=name, ingress_class=ingress_class,
                      annotations=annotations, default_backend=default_backend, rules=rules,
                      creation_timestamp=str(created) if created is not None else "", source=source)
    return ingress, p.errors
