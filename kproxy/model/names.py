"""Names and small enumerations shared by every part of the model.

``ServicePortName`` is kube-proxy's key for everything it programs: a Service's namespace and
name, the port's name and its protocol (``pkg/proxy/types.go``). Its text form is
``namespace/name:port``, or ``namespace/name`` for an unnamed port; the protocol is part of
the identity but not of the text, as in kube-proxy.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "IPFamily",
    "NamespacedName",
    "Protocol",
    "ServicePortName",
    "family_of",
    "join_host_port",
]


class Protocol(StrEnum):
    """An L4 protocol a Service port can use (v1 ``Protocol``)."""

    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"


class IPFamily(StrEnum):
    """An IP family as the Kubernetes API spells it."""

    IPv4 = "IPv4"
    IPv6 = "IPv6"


def family_of(ip: str) -> IPFamily:
    """Return the family of a textual IP address.

    Raises:
        ValueError: ``ip`` is not an IP address.
    """
    return IPFamily.IPv6 if ipaddress.ip_address(ip).version == 6 else IPFamily.IPv4


def join_host_port(ip: str, port: int) -> str:
    """Format ``ip:port`` as Go's ``net.JoinHostPort`` does (IPv6 in brackets)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class NamespacedName:
    """``namespace/name`` of a namespaced object."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class ServicePortName:
    """kube-proxy's key for one port of one Service (``proxy.ServicePortName``).

    Attributes:
        namespace: the Service's namespace.
        name: the Service's name.
        port: the port's name; ``""`` for the single unnamed port a Service may have.
        protocol: the port's protocol; part of the identity (a slice port matches a Service
            port only with the same name and protocol), though API validation keeps port
            names unique within a Service.
    """

    namespace: str
    name: str
    port: str = ""
    protocol: Protocol = Protocol.TCP

    @property
    def service(self) -> NamespacedName:
        """The Service this port belongs to."""
        return NamespacedName(namespace=self.namespace, name=self.name)

    def __str__(self) -> str:
        base = f"{self.namespace}/{self.name}"
        return f"{base}:{self.port}" if self.port else base

    @classmethod
    def parse(cls, text: str, protocol: Protocol = Protocol.TCP) -> ServicePortName:
        """Parse ``namespace/name[:port]`` into a ServicePortName.

        Raises:
            ValueError: ``text`` has no ``/`` or an empty namespace or name.
        """
        ns, sep, rest = text.partition("/")
        name, _, port = rest.partition(":")
        if not sep or not ns or not name:
            raise ValueError(f"expected 'namespace/name[:port]', got {text!r}")
        return cls(namespace=ns, name=name, port=port, protocol=protocol)
