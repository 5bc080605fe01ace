"""A node's own state, read from the files of a node dump, as an emulation :class:`~emulation.node.Node`.

Theory of operation: every reader is a pure function of the text a standard tool prints. The
files and their producers (the node-dump directory contract):

- ``ip-addr.json``: ``ip -j addr show``: each link's ``ifname``, ``flags`` (``UP``) and
  ``addr_info`` (``local``, ``prefixlen``, ``scope``, ``secondary``); secondary addresses follow
  the primary ones, as ``inet_select_addr`` only considers primaries first.
- ``ip-link.json``: ``ip -j link show`` (or ``ip -d -j link show``): ``master`` names a port's
  bridge; ``linkinfo.info_kind`` ``bridge`` marks a bridge without ports.
- ``ip-route.json`` and ``ip6-route.json``: ``ip -j route show table all`` and
  ``ip -6 -j route show table all``. The ``main`` table (entries without ``table``) gives the
  routes; the ``local`` table's ``local`` entries that are not an interface address become
  :attr:`Node.local_prefixes` (AnyIP routes). Other tables are kept out: the dump has no
  ``ip rule`` list saying when they apply, so lookups follow the default policy (local, then
  main). Route types ``unicast``, ``blackhole``, ``unreachable`` and ``prohibit`` are modelled;
  ``throw``, ``nat``, ``anycast`` and multicast entries are not routes a forwarded packet takes.
- ``sysctl.txt``: ``name = value`` lines as ``sysctl`` prints them; ``net.ipv4.ip_forward`` and
  ``net.ipv4.conf.all.route_localnet`` shape the node.
- ``xt_recent/NAME``: ``/proc/net/xt_recent/NAME``, one ``src=ADDR ttl: T last_seen: J
  oldest_pkt: I J1, J2, ...`` line per address (as ``recent_seq_show`` prints it, jiffies).

Every reader raises :class:`~emulation.errors.InputError` naming the file on bad input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from emulation.addr import parse_address, parse_cidr
from emulation.errors import InputError
from emulation.node import Interface, Node, Route

__all__ = [
    "RecentLine",
    "node_from_dump",
    "parse_ip_addr",
    "parse_ip_link",
    "parse_ip_route",
    "parse_sysctl",
    "parse_xt_recent",
]

_ROUTE_KINDS = ("unicast", "blackhole", "unreachable", "prohibit")


def _json_list(text: str, name: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as err:
        raise InputError(f"{name}: not JSON ({err.msg} at line {err.lineno}); give `ip -j` output") from None
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise InputError(f"{name}: expected a JSON list of objects, as `ip -j` prints")
    return cast(list[dict[str, Any]], data)


def parse_ip_link(text: str, *, name: str = "ip-link.json") -> dict[str, tuple[str | None, bool]]:
    """``ip -j link show`` output as ``{ifname: (master, is_bridge)}``.

    A link is a bridge when ``linkinfo.info_kind`` says so (``ip -d``) or another link names it
    as ``master``.

    Raises:
        InputError: not a JSON list of links.
    """
    links = _json_list(text, name)
    out: dict[str, tuple[str | None, bool]] = {}
    masters = {str(e["master"]) for e in links if e.get("master")}
    for e in links:
        ifname = str(e.get("ifname", ""))
        if not ifname:
            raise InputError(f"{name}: a link without ifname: {e!r}")
        kind = (e.get("linkinfo") or {}).get("info_kind")
        master = e.get("master")
        out[ifname] = (str(master) if master else None, kind == "bridge" or ifname in masters)
    return out


def parse_ip_addr(text: str, *, name: str = "ip-addr.json",
                  links: Mapping[str, tuple[str | None, bool]] | None = None) -> tuple[Interface, ...]:
    """``ip -j addr show`` output as interfaces (addresses as ``local/prefixlen``, primaries first).

    Args:
        links: :func:`parse_ip_link`'s answer, for bridge masters (``ip addr`` prints ``master``
            too; this wins when given).

    Raises:
        InputError: not a JSON list of links, or an address that is not one.
    """
    out = []
    for e in _json_list(text, name):
        ifname = str(e.get("ifname", ""))
        if not ifname:
            raise InputError(f"{name}: a link without ifname: {e!r}")
        primary: list[tuple[str, str]] = []
        secondary: list[tuple[str, str]] = []
        for a in e.get("addr_info") or ():
            if a.get("family") not in ("inet", "inet6") or "local" not in a:
                continue
            cidr = f"{a['local']}/{a.get('prefixlen', 32 if a['family'] == 'inet' else 128)}"
            try:
                parse_cidr(cidr)
            except ValueError:
                raise InputError(f"{name}: {ifname}: bad address {cidr!r}") from None
            (secondary if a.get("secondary") else primary).append((cidr, str(a.get("scope", "global"))))
        entries = primary + secondary
        master, bridge = (links or {}).get(ifname, (e.get("master"), False))
        out.append(Interface(name=ifname, addresses=tuple(c for c, _ in entries),
                             scopes=tuple(s for _, s in entries), master=master or None, bridge=bridge,
                             up="UP" in (e.get("flags") or ())))
    return tuple(out)


def parse_ip_route(text: str, version: int, *, name: str = "ip-route.json",
                   devices: Sequence[str] = ()) -> tuple[tuple[Route, ...], tuple[str, ...]]:
    """``ip [-6] -j route show table all`` output as ``(main-table routes, local prefixes)``.

    Args:
        version: 4 or 6, the family of a ``default`` route without a gateway (``ip -j route``
            does not print the family; ``ip -j route show table all`` lists both, so every other
            entry's family comes from its destination or gateway).
        devices: the node's interface names; a route through another device is left out (the
            dumps were taken at different moments).

    Returns:
        The ``main`` table's routes of the kinds :class:`Route` models, and the ``local``
        table's ``local`` entries as CIDRs (interface addresses among them too; the caller
        drops those it has).

    Raises:
        InputError: not a JSON list of routes, or a destination or gateway that is not an address.
    """
    routes: list[Route] = []
    local: list[str] = []
    known = set(devices)
    for e in _json_list(text, name):
        table = str(e.get("table", "main"))
        kind = str(e.get("type", "unicast"))
        dst = str(e.get("dst", ""))
        if not dst:
            continue
        via = e.get("gateway")
        family = 6 if ":" in dst or (dst == "default" and via and ":" in str(via)) else \
            4 if dst != "default" or via else version
        if table == "local":
            if kind == "local":
                local.append(dst if "/" in dst else f"{dst}/{32 if family == 4 else 128}")
            continue
        if table != "main" or kind not in _ROUTE_KINDS:
            continue
        dev = str(e.get("dev", ""))
        if dev and known and dev not in known:
            continue
        try:
            routes.append(Route(destination=dst, device=dev, via=str(via) if via else None,
                                kind=cast(Literal["unicast", "blackhole", "unreachable", "prohibit"], kind),
                                version=family, metric=int(e.get("metric", 0)),
                                prefsrc=str(e["prefsrc"]) if e.get("prefsrc") else None))
        except ValueError as err:
            raise InputError(f"{name}: route {e!r}: {err}") from None
    return tuple(routes), tuple(local)


def parse_sysctl(text: str, *, name: str = "sysctl.txt") -> dict[str, str]:
    """``sysctl`` output (``name = value`` lines; ``#`` comments and blank lines skipped).

    Raises:
        InputError: a line without ``=`` (naming it).
    """
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise InputError(f"{name}: expected `name = value`", line=n, text=line)
        out[key.strip().replace("/", ".")] = value.strip()
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RecentLine:
    """One address of an ``xt_recent`` list: ``version``, ``value`` (the address as an integer),
    ``ttl`` and its hit stamps in jiffies, oldest first (``last_seen`` is the newest)."""

    version: int
    value: int
    ttl: int
    stamps: tuple[int, ...]


def parse_xt_recent(text: str, *, name: str = "xt_recent") -> tuple[RecentLine, ...]:
    """``/proc/net/xt_recent/NAME`` lines, as ``recent_seq_show`` (net/netfilter/xt_recent.c)
    prints them: ``src=ADDR ttl: T last_seen: J oldest_pkt: I J1, J2, ...``; the stamps are a
    ring of which ``I`` is the index of the oldest.

    Raises:
        InputError: a line that does not have that shape (naming it).
    """
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        try:
            head, _, ring = line.partition("oldest_pkt:")
            fields = head.split()
            src = fields[0].removeprefix("src=")
            ttl = int(fields[fields.index("ttl:") + 1])
            last = int(fields[fields.index("last_seen:") + 1])
            parts = ring.split(None, 1)
            oldest = int(parts[0]) if parts else 0
            ring_stamps = [int(x) for x in parts[1].replace(",", " ").split()] if len(parts) > 1 else []
            version, value = parse_address(src)
        except (ValueError, IndexError):
            raise InputError(f"{name}: expected `src=ADDR ttl: T last_seen: J oldest_pkt: I J, ...`",
                             line=n, text=line) from None
        stamps = ring_stamps[oldest:] + ring_stamps[:oldest] if ring_stamps else [last]
        out.append(RecentLine(version=version, value=value, ttl=ttl,
                              stamps=tuple(s for s in stamps if s) or (last,)))
    return tuple(out)


def _flag(sysctls: Mapping[str, str], key: str, default: bool) -> bool:
    value = sysctls.get(key)
    return default if value is None else value.strip() not in ("0", "")


def node_from_dump(*, ip_addr: str | None = None, ip_route: str | None = None, ip6_route: str | None = None,
                   ip_link: str | None = None, sysctl: str | None = None,
                   defaults: Node | None = None) -> Node:
    """The node of a dump's texts (each ``None`` when the file is missing).

    Args:
        defaults: what a missing part falls back to: its interfaces when there is no
            ``ip_addr``, its routes when there is no route file at all, its sysctls otherwise.

    Raises:
        InputError: a file that does not parse (naming it).
    """
    base = defaults or Node()
    links = parse_ip_link(ip_link) if ip_link is not None else None
    interfaces = parse_ip_addr(ip_addr, links=links) if ip_addr is not None else base.interfaces
    names = [i.name for i in interfaces]
    addresses = {parse_address(a.partition("/")[0]) for i in interfaces for a in i.addresses}
    routes: list[Route] = []
    local: list[str] = []
    seen: set[Route] = set()
    for text, version, fname in ((ip_route, 4, "ip-route.json"), (ip6_route, 6, "ip6-route.json")):
        if text is None:
            continue
        found, extra = parse_ip_route(text, version, name=fname, devices=names)
        routes.extend(r for r in found if r not in seen)
        seen.update(found)
        for cidr in extra:
            net = parse_cidr(cidr)
            if net.prefix == (32 if net.version == 4 else 128) and (net.version, net.network) in addresses:
                continue
            if net == parse_cidr("127.0.0.0/8") or cidr in local:
                continue
            local.append(cidr)
    if ip_route is None and ip6_route is None:
        routes = [r for r in base.routes if not r.device or r.device in names]
    sysctls = parse_sysctl(sysctl) if sysctl is not None else {}
    return Node(interfaces=interfaces, routes=tuple(routes),
                route_localnet=_flag(sysctls, "net.ipv4.conf.all.route_localnet", base.route_localnet),
                ip_forward=_flag(sysctls, "net.ipv4.ip_forward", base.ip_forward),
                tcp_loose=_flag(sysctls, "net.netfilter.nf_conntrack_tcp_loose", base.tcp_loose),
                local_prefixes=tuple(local))
