"""kube-proxy's iptables chain names, comments and small constants.

Per service port kube-proxy derives one 16-character hash from the ServicePortName's text
(``namespace/name:port``, or ``namespace/name`` for an unnamed port) followed by the lower-case
protocol, with no separator: the first 16 characters of the RFC 4648 base32 encoding of its
SHA-256 (``portProtoHash``). ``KUBE-SVC-``, ``KUBE-SVL-``, ``KUBE-EXT-`` and ``KUBE-FW-`` share
that hash. An endpoint chain hashes the same text with the endpoint's ``ip:port``
(``[ip]:port`` for IPv6) appended (``servicePortEndpointChainName``).

Sixteen base32 characters (RFC 4648 alphabet) carry 80 bits, exactly the first 10 bytes of
the digest, so only those are encoded. Results are memoised: a full render of a large cluster hashes each name
once per process, not once per sync.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

__all__ = [
    "KUBE_EXTERNAL_SERVICES",
    "KUBE_FIREWALL",
    "KUBE_FORWARD",
    "KUBE_MARK_MASQ",
    "KUBE_NODEPORTS",
    "KUBE_POSTROUTING",
    "KUBE_PROXY_FIREWALL",
    "KUBE_SERVICES",
    "NFACCT_CT_STATE_INVALID_DROPPED",
    "NFACCT_LOCALHOST_NODEPORT_ACCEPTED",
    "SERVICE_CHAIN_PREFIXES",
    "compute_probability",
    "endpoint_chain_name",
    "external_chain_name",
    "firewall_chain_name",
    "is_service_chain_name",
    "local_policy_chain_name",
    "port_proto_hash",
    "probability",
    "service_chain_name",
]

KUBE_SERVICES = "KUBE-SERVICES"
KUBE_EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES"
KUBE_NODEPORTS = "KUBE-NODEPORTS"
KUBE_POSTROUTING = "KUBE-POSTROUTING"
KUBE_MARK_MASQ = "KUBE-MARK-MASQ"
KUBE_FORWARD = "KUBE-FORWARD"
KUBE_PROXY_FIREWALL = "KUBE-PROXY-FIREWALL"
#: kubelet's anti-martian chain, which kube-proxy duplicates (IPv4 with localhost NodePorts).
KUBE_FIREWALL = "KUBE-FIREWALL"

#: nfacct object counting INVALID packets dropped in KUBE-FORWARD (metric only).
NFACCT_CT_STATE_INVALID_DROPPED = "ct_state_invalid_dropped_pkts"
#: nfacct object counting NodePort packets accepted on 127.0.0.0/8 (metric only).
NFACCT_LOCALHOST_NODEPORT_ACCEPTED = "localhost_nps_accepted_pkts"

#: Prefixes of the per-service nat chains; a stale chain with one of these is deleted.
SERVICE_CHAIN_PREFIXES = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-")

_CACHE_SIZE = 1 << 18  # names of ~250k endpoints: a 10,000 x 10 cluster fits twice over


_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# Two base32 digits per 10 bits: CPython 3.11's base64.b32encode is pure Python and 3x slower.
_B32_PAIRS = tuple(_B32[i >> 5] + _B32[i & 31] for i in range(1024))


def _hash16(text: str) -> str:
    n = int.from_bytes(hashlib.sha256(text.encode()).digest()[:10], "big")
    t = _B32_PAIRS
    return (t[n >> 70] + t[(n >> 60) & 1023] + t[(n >> 50) & 1023] + t[(n >> 40) & 1023]
            + t[(n >> 30) & 1023] + t[(n >> 20) & 1023] + t[(n >> 10) & 1023] + t[n & 1023])


@lru_cache(maxsize=_CACHE_SIZE)
def port_proto_hash(service_port_name: str, protocol: str) -> str:
    """The 16-character hash kube-proxy names a service port's chains with.

    Args:
        service_port_name: ``str(ServicePortName)``, e.g. ``ns1/svc1:p80``.
        protocol: lower-case ``tcp``, ``udp`` or ``sctp``.
    """
    return _hash16(service_port_name + protocol)


def service_chain_name(service_port_name: str, protocol: str) -> str:
    """``KUBE-SVC-<hash>``: dispatch to the endpoints of Cluster traffic policy."""
    return "KUBE-SVC-" + port_proto_hash(service_port_name, protocol)


def local_policy_chain_name(service_port_name: str, protocol: str) -> str:
    """``KUBE-SVL-<hash>``: dispatch to this node's endpoints (Local traffic policy)."""
    return "KUBE-SVL-" + port_proto_hash(service_port_name, protocol)


def external_chain_name(service_port_name: str, protocol: str) -> str:
    """``KUBE-EXT-<hash>``: traffic to NodePorts, external IPs and load-balancer IPs."""
    return "KUBE-EXT-" + port_proto_hash(service_port_name, protocol)


def firewall_chain_name(service_port_name: str, protocol: str) -> str:
    """``KUBE-FW-<hash>``: ``loadBalancerSourceRanges`` filtering."""
    return "KUBE-FW-" + port_proto_hash(service_port_name, protocol)


@lru_cache(maxsize=_CACHE_SIZE)
def endpoint_chain_name(service_port_name: str, protocol: str, endpoint: str) -> str:
    """``KUBE-SEP-<hash>`` of one endpoint (``ip:port``, ``[ip]:port`` for IPv6)."""
    return "KUBE-SEP-" + _hash16(service_port_name + protocol + endpoint)


def is_service_chain_name(chain: str) -> bool:
    """True for the per-service chains kube-proxy deletes when they become stale."""
    return chain.startswith(SERVICE_CHAIN_PREFIXES)


def compute_probability(n: int) -> str:
    """``1/n`` formatted as kube-proxy does (``%0.10f``), e.g. 3 -> ``0.3333333333``.

    Raises:
        ValueError: ``n`` is not positive.
    """
    if n < 1:
        raise ValueError(f"expected a positive endpoint count, got {n=}")
    return "%0.10f" % (1.0 / n)


_PROBABILITIES: list[str] = ["<bad value>"]


def probability(n: int) -> str:
    """:func:`compute_probability` from a table grown on demand (kube-proxy precomputes too)."""
    table = _PROBABILITIES
    if n >= len(table):
        table.extend(compute_probability(i) for i in range(len(table), n + 1))
    return table[n]
