"""Istio ``DestinationRule`` (networking.istio.io/v1, v1beta1, v1alpha3): its load-balancer settings.

Only what the HTTP plane uses is read (istio/api ``networking/v1alpha3/destination_rule.proto``):
``spec.host``, ``trafficPolicy.loadBalancer`` (``simple`` or ``consistentHash`` with
``httpHeaderName``, ``httpCookie {name, path, ttl}``, ``useSourceIp`` or
``httpQueryParameterName``, and ``ringHash {minimumRingSize}``, ``maglev {tableSize}`` or the
deprecated ``minimumRingSize``) and ``trafficPolicy.portLevelSettings[].{port.number,
loadBalancer}``. Subsets, TLS and outlier detection are not read. A bad field is reported with
its file, object and field and its policy left out; the rest of the object is kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kproxy.errors import InvalidObject
from kproxy.model._fields import Problems, as_bool, as_int, as_list, as_map, as_str

__all__ = [
    "DESTINATION_RULE_API_VERSIONS",
    "ConsistentHash",
    "DestinationRule",
    "HashAlgorithm",
    "HashKey",
    "LoadBalancerSettings",
    "PortLoadBalancer",
    "parse_destination_rule",
]

DESTINATION_RULE_API_VERSIONS = frozenset({"networking.istio.io/v1", "networking.istio.io/v1beta1",
                                           "networking.istio.io/v1alpha3"})
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(h|m|s|ms|us|ns)$")
_DURATION_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class HashKey(StrEnum):
    """Which request value ``consistentHash`` hashes."""

    HEADER = "httpHeaderName"
    COOKIE = "httpCookie"
    SOURCE_IP = "useSourceIp"
    QUERY_PARAMETER = "httpQueryParameterName"


class HashAlgorithm(StrEnum):
    """``ringHash`` (Envoy's RING_HASH, also the default) or ``maglev``."""

    RING_HASH = "ringHash"
    MAGLEV = "maglev"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsistentHash:
    """``LoadBalancerSettings.ConsistentHashLB``.

    Attributes:
        key: what is hashed; name: the header, cookie or query parameter name (``""`` for
            source IP).
        cookie_path: ``httpCookie.path``; cookie_ttl_s: ``httpCookie.ttl`` in whole seconds, or
            None when unset (then Envoy never generates the cookie).
        algorithm: ring hash or Maglev; size: ``minimumRingSize`` or ``tableSize``, 0 for
            Envoy's default.
    """

    key: HashKey
    name: str = ""
    cookie_path: str = ""
    cookie_ttl_s: int | None = None
    algorithm: HashAlgorithm = HashAlgorithm.RING_HASH
    size: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadBalancerSettings:
    """``LoadBalancerSettings``: ``simple`` (e.g. ``ROUND_ROBIN``) or a consistent hash."""

    simple: str | None = None
    consistent_hash: ConsistentHash | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PortLoadBalancer:
    """One ``portLevelSettings[]`` entry: a port number and its load balancer."""

    port: int
    load_balancer: LoadBalancerSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class DestinationRule:
    """An Istio DestinationRule, as far as load balancing goes.

    Attributes:
        namespace, name: identity.
        host: ``spec.host`` as written (a short name is relative to ``namespace``).
        load_balancer: the top-level ``trafficPolicy.loadBalancer`` or None.
        port_level: the port-level load balancers, in spec order.
        source: where it came from (not compared).
    """

    namespace: str
    name: str
    host: str
    load_balancer: LoadBalancerSettings | None = None
    port_level: tuple[PortLoadBalancer, ...] = ()
    source: str = field(default="", compare=False)

    def policy_for(self, port: int) -> LoadBalancerSettings | None:
        """The port-level load balancer of ``port`` if any, else the top-level one (Istio's precedence)."""
        for entry in self.port_level:
            if entry.port == port:
                return entry.load_balancer
        return self.load_balancer

    def fqdn(self, domain: str = "cluster.local") -> str:
        """``host`` with a short name expanded to ``host.namespace.svc.<domain>`` (Istio's resolution)."""
        return self.host if "." in self.host or self.host.startswith("*") else \
            f"{self.host}.{self.namespace}.svc.{domain}"


def _duration_s(value: Any, path: str, p: Problems) -> int | None:
    text = as_str(value, path, p)
    if text is None:
        return None
    m = _DURATION.match(text)
    if m is None:
        p.add(path, f"expected a duration such as 10s or 1h: {text!r}")
        return None
    return int(float(m.group(1)) * _DURATION_S[m.group(2)])


def _parse_hash(raw: Mapping[str, Any], path: str, p: Problems) -> ConsistentHash | None:
    before = len(p.errors)
    keys = [k for k in HashKey if raw.get(k.value) not in (None, False, "")]
    if len(keys) != 1:
        p.add(path, f"exactly one of httpHeaderName, httpCookie, useSourceIp, httpQueryParameterName "
                    f"is expected, got {[k.value for k in keys]}")
        return None
    key = keys[0]
    name = cookie_path = ""
    ttl: int | None = None
    if key is HashKey.COOKIE:
        cookie = as_map(raw.get("httpCookie"), f"{path}.httpCookie", p) or {}
        name = as_str(cookie.get("name"), f"{path}.httpCookie.name", p) or ""
        if not name:
            p.add(f"{path}.httpCookie.name", "the cookie name is required")
        cookie_path = as_str(cookie.get("path"), f"{path}.httpCookie.path", p) or ""
        if cookie.get("ttl") is not None:
            ttl = _duration_s(cookie.get("ttl"), f"{path}.httpCookie.ttl", p)
    elif key is HashKey.SOURCE_IP:
        as_bool(raw.get("useSourceIp"), f"{path}.useSourceIp", p, default=False)
    else:
        name = as_str(raw.get(key.value), f"{path}.{key.value}", p) or ""
    algorithm, size = HashAlgorithm.RING_HASH, 0
    if isinstance(raw.get("maglev"), Mapping):
        algorithm = HashAlgorithm.MAGLEV
        size = as_int(raw["maglev"].get("tableSize", 0), f"{path}.maglev.tableSize", p) or 0
    elif isinstance(raw.get("ringHash"), Mapping):
        size = as_int(raw["ringHash"].get("minimumRingSize", 0), f"{path}.ringHash.minimumRingSize", p) or 0
    elif raw.get("minimumRingSize") is not None:
        size = as_int(raw.get("minimumRingSize"), f"{path}.minimumRingSize", p) or 0
    if size < 0:
        p.add(path, f"a ring or table size must not be negative: {size}")
    if len(p.errors) != before:
        return None
    return ConsistentHash(key=key, name=name, cookie_path=cookie_path, cookie_ttl_s=ttl,
                          algorithm=algorithm, size=size)


def _parse_lb(raw: Any, path: str, p: Problems) -> LoadBalancerSettings | None:
    lb = as_map(raw, path, p)
    if lb is None:
        return None
    if isinstance(lb.get("consistentHash"), Mapping):
        ch = _parse_hash(lb["consistentHash"], f"{path}.consistentHash", p)
        return LoadBalancerSettings(consistent_hash=ch) if ch is not None else None
    simple = as_str(lb.get("simple"), f"{path}.simple", p, default="") or None
    return LoadBalancerSettings(simple=simple)


def parse_destination_rule(raw: Mapping[str, Any], *,
                           source: str = "") -> tuple[DestinationRule, list[InvalidObject]]:
    """Parse one DestinationRule's host and load-balancer settings.

    Returns:
        The DestinationRule and one problem per policy left out.

    Raises:
        InvalidObject: no name, an unknown API version, or no ``spec.host``.
    """
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    namespace = meta.get("namespace") or "default"
    name = meta.get("name")
    p = Problems(obj=f"DestinationRule {namespace}/{name or '?'}", source=source)
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        raise p.fail("metadata.name", "the name is missing")
    if raw.get("apiVersion") not in DESTINATION_RULE_API_VERSIONS:
        raise p.fail("apiVersion", f"expected one of {sorted(DESTINATION_RULE_API_VERSIONS)}, "
                                   f"got {raw.get('apiVersion')!r}")
    spec = as_map(raw.get("spec"), "spec", p) or {}
    host = as_str(spec.get("host"), "spec.host", p)
    if not host:
        raise p.fail("spec.host", "the host is required")
    policy = as_map(spec.get("trafficPolicy"), "spec.trafficPolicy", p) or {}
    top = None
    if policy.get("loadBalancer") is not None:
        top = _parse_lb(policy.get("loadBalancer"), "spec.trafficPolicy.loadBalancer", p)
    port_level: list[PortLoadBalancer] = []
    levels = as_list(policy.get("portLevelSettings"), "spec.trafficPolicy.portLevelSettings", p)
    for i, entry in enumerate(levels):
        epath = f"spec.trafficPolicy.portLevelSettings[{i}]"
        e = as_map(entry, epath, p)
        if e is None or e.get("loadBalancer") is None:
            continue
        port = as_map(e.get("port"), f"{epath}.port", p) or {}
        number = as_int(port.get("number"), f"{epath}.port.number", p)
        lb = _parse_lb(e.get("loadBalancer"), f"{epath}.loadBalancer", p)
        if number is not None and lb is not None:
            port_level.append(PortLoadBalancer(port=number, load_balancer=lb))
    return DestinationRule(namespace=namespace, name=name, host=host, load_balancer=top,
                           port_level=tuple(port_level), source=source), p.errors
