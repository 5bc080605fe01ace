"""kube-proxy's nftables names: the table, its fixed chains, sets and maps, and the per-service chains.

Per-service names follow ``pkg/proxy/nftables/proxier.go``: ``servicePortChainNameBase`` is
``NS/NAME/PROTO/PORTNAME`` and ``servicePortEndpointChainNameBase`` appends ``__IP/PORT`` (an IPv6
address with its colons turned into dots); ``hashAndTruncate`` prefixes the base with the first
8 characters of the standard base32 of its SHA-256 and a dash, and cuts anything longer than
``chainNameBaseLengthMax`` (240) to 237 characters plus ``...``. ``service-``, ``local-``,
``external-``, ``firewall-``, ``endpoint-`` and ``affinity-`` prefix the base.
"""

from __future__ import annotations

import hashlib

from kproxy.model.names import ServicePortName

__all__ = [
    "CHAIN_NAME_BASE_LENGTH_MAX",
    "CLUSTER_IPS_CHECK",
    "CLUSTER_IPS_SET",
    "FIREWALL_CHECK",
    "FIREWALL_IPS_MAP",
    "MARK_MASQ_CHAIN",
    "MASQUERADING_CHAIN",
    "NODEPORT_ENDPOINTS_CHECK",
    "NODEPORT_IPS_SET",
    "NO_ENDPOINT_NODEPORTS_MAP",
    "NO_ENDPOINT_SERVICES_MAP",
    "REJECT_CHAIN",
    "SERVICES_CHAIN",
    "SERVICE_ENDPOINTS_CHECK",
    "SERVICE_IPS_MAP",
    "SERVICE_NODEPORTS_MAP",
    "TABLE",
    "affinity_set_name",
    "endpoint_base",
    "endpoint_chain_name",
    "hash_and_truncate",
    "hash_prefix",
    "is_affinity_set_name",
    "is_service_chain_name",
    "service_chain_base",
]

#: kube-proxy's ``kubeProxyTable``, in the ``ip`` and ``ip6`` families.
TABLE = "kube-proxy"

SERVICES_CHAIN = "services"
SERVICE_IPS_MAP = "service-ips"
SERVICE_NODEPORTS_MAP = "service-nodeports"
NODEPORT_IPS_SET = "nodeport-ips"
CLUSTER_IPS_SET = "cluster-ips"
SERVICE_ENDPOINTS_CHECK = "service-endpoints-check"
NODEPORT_ENDPOINTS_CHECK = "nodeport-endpoints-check"
NO_ENDPOINT_SERVICES_MAP = "no-endpoint-services"
NO_ENDPOINT_NODEPORTS_MAP = "no-endpoint-nodeports"
REJECT_CHAIN = "reject-chain"
CLUSTER_IPS_CHECK = "cluster-ips-check"
FIREWALL_IPS_MAP = "firewall-ips"
FIREWALL_CHECK = "firewall-check"
MARK_MASQ_CHAIN = "mark-for-masquerade"
MASQUERADING_CHAIN = "masquerading"

#: ``knftables.NameLengthMax`` (256) minus ``chainNamePrefixLengthMax`` (16).
CHAIN_NAME_BASE_LENGTH_MAX = 240


_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
#: Every 10-bit value as its two base32 characters (RFC 4648's alphabet).
_B32_PAIRS = tuple(a + b for a in _B32 for b in _B32)


def hash_prefix(name: str) -> str:
    """The first 8 characters of the standard base32 of ``name``'s SHA-256.

    Base32 encodes 5 bytes as 8 characters, so these are the base32 of the digest's first 5
    bytes: 40 bits read as four 10-bit pairs, with no padding and no full encoding.
    """
    v = int.from_bytes(hashlib.sha256(name.encode()).digest()[:5], "big")
    pairs = _B32_PAIRS
    return pairs[v >> 30] + pairs[(v >> 20) & 1023] + pairs[(v >> 10) & 1023] + pairs[v & 1023]


def hash_and_truncate(name: str) -> str:
    """``HASH-name``, cut to 240 characters (kube-proxy's ``hashAndTruncate``)."""
    out = f"{hash_prefix(name)}-{name}"
    if len(out) > CHAIN_NAME_BASE_LENGTH_MAX:
        out = out[:CHAIN_NAME_BASE_LENGTH_MAX - 3] + "..."
    return out


def service_chain_base(spn: ServicePortName) -> str:
    """``HASH-ns/name/proto/port`` (``servicePortChainNameBase``), e.g. ``ULMVA6XW-ns1/svc1/tcp/p80``."""
    proto = spn.protocol.value.lower()
    return hash_and_truncate(f"{spn.namespace}/{spn.name}/{proto}/{spn.port}")


def endpoint_base(spn: ServicePortName, ip: str, port: int) -> str:
    """``HASH-ns/name/proto/port__IP/PORT`` (``servicePortEndpointChainNameBase``): the name of an
    endpoint's chain and affinity set after their ``endpoint-`` or ``affinity-`` prefix."""
    proto = spn.protocol.value.lower()
    return hash_and_truncate(f"{spn.namespace}/{spn.name}/{proto}/{spn.port}__{ip.replace(':', '.')}/{port}")


def endpoint_chain_name(spn: ServicePortName, ip: str, port: int) -> str:
    """``endpoint-HASH-ns/name/proto/port__IP/PORT`` (IPv6 colons become dots)."""
    return "endpoint-" + endpoint_base(spn, ip, port)


def affinity_set_name(spn: ServicePortName, ip: str, port: int) -> str:
    """``affinity-HASH-...``: the ClientIP affinity set of one endpoint."""
    return "affinity-" + endpoint_base(spn, ip, port)


def is_service_chain_name(name: str) -> bool:
    """kube-proxy's ``isServiceChainName``: per-service chains, and only they, hold a ``/``."""
    return "/" in name


def is_affinity_set_name(name: str) -> bool:
    """kube-proxy's ``isAffinitySetName``."""
    return name.startswith("affinity-")
