"""Flag and file values read as kube-proxy reads them, each error naming where the value came from.

Pure functions: each takes the value and ``name``, what an error calls it (a flag such as
``--cluster-cidr``, or ``--config FILE: clusterCIDR``), and returns the canonical value.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from kproxy.config.durations import parse_duration
from kproxy.errors import ConfigError
from kproxy.model.names import IPFamily

__all__ = [
    "parse_bool",
    "parse_cidr_list",
    "parse_families",
    "parse_ip_list",
    "parse_ipv4_cidr",
    "parse_node_ips",
    "parse_period",
    "parse_service_cidrs",
    "parse_specific_ip",
]


def parse_bool(text: str, *, name: str) -> bool:
    """``true``/``false`` (and 1/0, t/f, yes/no) as Go's ``strconv.ParseBool`` reads a bool flag.

    Raises:
        ConfigError: any other word.
    """
    value = text.strip().lower()
    if value in ("true", "1", "t", "yes"):
        return True
    if value in ("false", "0", "f", "no"):
        return False
    raise ConfigError(f"{name}: expected true or false, got {text!r}")


def parse_node_ips(values: Sequence[str], *, name: str = "--node-ip") -> tuple[str, ...]:
    """``--node-ip`` values: IP addresses, several per family allowed, canonical and de-duplicated.

    kube-proxy's own fixtures give a node several addresses per family; the first of a family
    is that family's primary IP (``nodeIP`` of its proxier).

    Raises:
        ConfigError: a value is not an IP address.
    """
    out: list[str] = []
    for value in values:
        try:
            ip = str(ipaddress.ip_address(value.strip()))
        except ValueError:
            raise ConfigError(f"{name}: expected an IP address, got {value!r}") from None
        if ip not in out:
            out.append(ip)
    return tuple(out)


def parse_cidr_list(text: str, *, name: str) -> tuple[str, ...]:
    """``--cluster-cidr`` / ``clusterCIDR``: comma-separated CIDRs, at most one per family (as kube-proxy).

    Raises:
        ConfigError: a value that is not a CIDR, or two CIDRs of one family.
    """
    cidrs = tuple(p.strip() for p in text.split(",") if p.strip())
    seen: dict[int, str] = {}
    for cidr in cidrs:
        try:
            version = ipaddress.ip_network(cidr, strict=False).version
        except ValueError:
            raise ConfigError(f"{name}: expected a CIDR such as 10.0.0.0/8, got {cidr!r}") from None
        if version in seen:
            raise ConfigError(f"{name}: at most one CIDR per IP family (one IPv4 and one IPv6), "
                              f"got {seen[version]!r} and {cidr!r}")
        seen[version] = cidr
    return cidrs


def parse_service_cidrs(text: str, *, name: str) -> tuple[str, ...]:
    """``--service-cidr CIDR[,CIDR]``: the ranges ClusterIPs are allocated from, in canonical spelling.

    kube-proxy's nftables proxier learns them from the cluster's ServiceCIDR objects
    (``OnServiceCIDRsChanged``), so a family may have several; each is written as
    ``ipaddress`` spells the network (``10.96.0.0/12``), duplicates dropped.

    Raises:
        ConfigError: a value that is not a CIDR (the message names ``name``).
    """
    out: list[str] = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            cidr = str(ipaddress.ip_network(part.strip(), strict=False))
        except ValueError:
            raise ConfigError(f"{name}: expected a CIDR such as 10.96.0.0/12, got {part.strip()!r}") from None
        if cidr not in out:
            out.append(cidr)
    return tuple(out)


def parse_families(text: str, *, name: str) -> tuple[IPFamily, ...]:
    """``--ip-families IPv4,IPv6`` (or ``--ip-family IPv6``): the families, primary first.

    Raises:
        ConfigError: an unknown family, one listed twice, or none.
    """
    out: list[IPFamily] = []
    for item in text.split(","):
        word = item.strip()
        matches = [f for f in IPFamily if f.value.lower() == word.lower()]
        if not matches:
            raise ConfigError(f"{name}: unknown family {word!r}; expected IPv4 and/or IPv6")
        if matches[0] in out:
            raise ConfigError(f"{name}: {word} is listed twice")
        out.append(matches[0])
    return tuple(out)


def parse_period(text: str, *, name: str, positive: bool = False) -> float:
    """A Go duration (``1s``, ``250ms``) in seconds.

    Args:
        positive: refuse ``0`` too.

    Raises:
        ConfigError: not a Go duration, negative, or zero when ``positive``.
    """
    seconds = parse_duration(text, flag=name)
    if positive and seconds <= 0:
        raise ConfigError(f"{name}: expected a duration > 0, got {text!r}")
    return seconds


def parse_count(text: str, *, name: str) -> int:
    """A whole number >= 1 (a cap such as ``--max-connections 5000``).

    Raises:
        ConfigError: not a whole number, or below 1.
    """
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise ConfigError(f"{name}: expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise ConfigError(f"{name}: expected a whole number >= 1, got {text!r}")
    return value


def parse_ip_list(text: str, *, name: str) -> tuple[str, ...]:
    """``IP[,IP]`` (brackets around IPv6 allowed), canonical.

    Raises:
        ConfigError: an element that is not an IP address.
    """
    out = []
    for item in text.split(","):
        host = item.strip().strip("[]")
        try:
            out.append(str(ipaddress.ip_address(host)))
        except ValueError:
            raise ConfigError(f"{name}: {item.strip()!r} is not an IP address; "
                              "expected IP[,IP] (0.0.0.0 or :: for every address)") from None
    return tuple(out)


def parse_specific_ip(text: str, *, name: str) -> str:
    """One specific IP address (not the wildcard), canonical, as ``--bind-address`` needs.

    Raises:
        ConfigError: not an IP address, or ``0.0.0.0``/``::``.
    """
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        raise ConfigError(f"{name}: expected an IP address such as 127.0.0.1, got {text!r}") from None
    if ip.is_unspecified:
        raise ConfigError(f"{name}: expected a specific address; a wildcard cannot answer UDP from the "
                          f"address the client used (got {text!r})")
    return str(ip)


def parse_ipv4_cidr(text: str, *, name: str) -> str:
    """An IPv4 CIDR such as ``127.0.0.0/8`` (host bits allowed), as given.

    Raises:
        ConfigError: not an IPv4 CIDR.
    """
    try:
        net = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        net = None
    if not isinstance(net, ipaddress.IPv4Network):
        raise ConfigError(f"{name}: expected an IPv4 CIDR such as 127.0.0.0/8, got {text!r}")
    return text.strip()
