"""The node model traces and the emulated kernels use when only the node's addresses are known.

One interface ``eth0`` carrying the node IPs (plus a placeholder address per family when none is
given, so MASQUERADE has an address to pick) and default routes out of it, ``lo``, and
``route_localnet`` on (kube-proxy sets it for localhost NodePorts).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from emulation import Interface, Node, Route
from kproxy.errors import ConfigError

__all__ = ["EXTERNAL_INTERFACE", "PLACEHOLDER_IPS", "trace_node"]

#: The interface packets from outside arrive on, and forwarded packets leave by.
EXTERNAL_INTERFACE = "eth0"
#: Addresses given to ``eth0`` for a family without node IPs (TEST-NET, never a real node).
PLACEHOLDER_IPS = {4: "192.0.2.1", 6: "2001:db8:ffff::1"}

def trace_node(node_ips: Sequence[str], *, route_localnet: bool = True) -> Node:
    """The node model described in the module docstring.

    Raises:
        ConfigError: a node IP is not an IP address.
    """
    addresses: list[str] = []
    versions = set()
    for ip in node_ips:
        try:
            parsed = ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(f"--node-ip: expected an IP address, got {ip!r}") from None
        if parsed.is_loopback:
            continue
        versions.add(parsed.version)
        addresses.append(f"{parsed}/{parsed.max_prefixlen}")
    for version, ip in PLACEHOLDER_IPS.items():
        if version not in versions:
            addresses.append(f"{ip}/{32 if version == 4 else 128}")
    return Node(
        interfaces=(Interface(name=EXTERNAL_INTERFACE, addresses=tuple(addresses)),),
        routes=(Route(destination="default", device=EXTERNAL_INTERFACE),
                Route(destination="default", device=EXTERNAL_INTERFACE, version=6)),
        route_localnet=route_localnet,
    )
