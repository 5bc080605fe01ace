"""Sets and the set table of one namespace; membership as ``-m set --match-set`` tests it.

``net/netfilter/ipset/``: ``ip_set_hash_ip.c`` and friends for the hash types (exact members;
``hash:net`` and the ``net`` part of ``hash:ip,port,net`` match any address inside a stored
network), ``ip_set_bitmap_port.c`` for ``bitmap:port`` (a port in ``range FROM-TO``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from emulation.ipset.errors import IpsetError
from emulation.ipset.settypes import TYPES, Part, SetType, format_element, parse_element

__all__ = ["IpSet", "IpsetTable"]

_PORTLESS = frozenset({"icmp", "icmpv6"})


@dataclass(slots=True)
class IpSet:
    """One set.

    Attributes:
        name: the set's name (at most 31 characters, ``IPSET_MAXNAMELEN - 1``).
        stype: its type.
        family: 4 or 6 (bitmap:port has none; kept as 4).
        options: the ``create`` options after the type, in order, as ``(name, value)``
            (value ``None`` for flags such as ``comment``); ``family`` is not among them.
        members: element -> comment (``None`` without one), in insertion order.
    """

    name: str
    stype: SetType
    family: int = 4
    options: tuple[tuple[str, str | None], ...] = ()
    members: dict[tuple[Part, ...], str | None] = field(default_factory=dict)
    _nets: set[int] = field(default_factory=set)

    def option(self, name: str) -> str | None:
        """The value of a ``create`` option (``hashsize``, ``maxelem``, ``range`` ...), or ``None``."""
        return next((v for k, v in self.options if k == name), None)

    @property
    def has_comment(self) -> bool:
        """Whether the set was created with the ``comment`` extension."""
        return any(k == "comment" for k, _ in self.options)

    def _range(self) -> tuple[int, int]:
        text = self.option("range") or "0-65535"
        a, _, b = text.partition("-")
        return int(a), int(b or a)

    def add(self, text: str, comment: str | None = None, *, exist: bool = False) -> None:
        """``ipset add``: store an element (ranges and CIDRs of ``ip`` parts expanded).

        Raises:
            IpsetError: bad element, already a member (unless ``exist``), out of range, full,
                or a comment on a set created without ``comment``.
        """
        if comment is not None and not self.has_comment:
            raise IpsetError(f"set {self.name} was created without the comment extension")
        elems = parse_element(self.stype, text, self.family)
        maxelem = int(self.option("maxelem") or 65536)
        for e in elems:
            if self.stype.is_bitmap:
                lo, hi = self._range()
                port = e[0][2]
                assert isinstance(port, int)
                if not lo <= port <= hi:
                    raise IpsetError(f"port {port} is outside the range {lo}-{hi} of set {self.name}")
            if e in self.members and not exist:
                raise IpsetError(f"element {text!r} is already added to set {self.name}")
            if e not in self.members and len(self.members) >= maxelem:
                raise IpsetError(f"set {self.name} is full (maxelem {maxelem})")
            self.members[e] = comment
        self._reindex()

    def delete(self, text: str, *, exist: bool = False) -> None:
        """``ipset del``.

        Raises:
            IpsetError: the element is not in the set (unless ``exist``).
        """
        for e in parse_element(self.stype, text, self.family):
            if e not in self.members:
                if exist:
                    continue
                raise IpsetError(f"element {text!r} is not in set {self.name}")
            del self.members[e]
        self._reindex()

    def _reindex(self) -> None:
        self._nets = {p[3] for e in self.members for p in e if p[0] == "net" and isinstance(p[3], int)}

    def test(self, text: str) -> bool:
        """``ipset test``: whether the element (a single one, no range) is a member."""
        elems = parse_element(self.stype, text, self.family)
        if len(elems) != 1:
            raise IpsetError(f"test takes one element, {text!r} is a range")
        probe = elems[0]
        return self._contains(probe)

    def _contains(self, probe: tuple[Part, ...]) -> bool:
        if probe in self.members:
            return True
        if not self._nets:
            return False
        # Networks: try every stored prefix length for the net dimension.
        idx = next(i for i, d in enumerate(self.stype.dims) if d == "net")
        p = probe[idx]
        version, value = p[1], p[2]
        assert isinstance(version, int) and isinstance(value, int)
        bits = 32 if version == 4 else 128
        for prefix in sorted(self._nets, reverse=True):
            mask = ((1 << bits) - 1) ^ ((1 << (bits - prefix)) - 1)
            cand = (*probe[:idx], ("net", version, value & mask, prefix), *probe[idx + 1 :])
            if cand in self.members:
                return True
        return False

    def match(self, keys: tuple[tuple[str, int, str], ...]) -> bool:
        """``-m set --match-set NAME f1,f2,...``: ``keys`` has one ``(ip, port, proto)`` per flag."""
        dims = self.stype.dims
        if len(keys) < len(dims):
            return False
        probe: list[Part] = []
        for dim, (ip_text, port, proto) in zip(dims, keys, strict=False):
            if dim == "port":
                if proto in _PORTLESS:
                    return False
                probe.append(("port", "" if self.stype.is_bitmap else proto, port))
                continue
            ip = ipaddress.ip_address(ip_text)
            if ip.version != self.family:
                return False
            if dim == "net":
                bits = 32 if ip.version == 4 else 128
                probe.append(("net", ip.version, int(ip), bits))
            else:
                probe.append(("ip", ip.version, int(ip)))
        if self.stype.is_bitmap:
            lo, hi = self._range()
            bport = probe[0][2]
            assert isinstance(bport, int)
            if not lo <= bport <= hi:
                return False
        return self._contains(tuple(probe))

    def elements(self) -> list[str]:
        """The members as ``ipset save`` text, in insertion order."""
        return [format_element(e) for e in self.members]


class IpsetTable:
    """The sets of one namespace; :meth:`lookup` is the netfilter ``SetLookup``."""

    def __init__(self) -> None:
        self.sets: dict[str, IpSet] = {}

    def create(
        self, name: str, type_name: str, *, family: int = 4, options: tuple[tuple[str, str | None], ...] = ()
    ) -> IpSet:
        """``ipset create``.

        Raises:
            IpsetError: the name is taken or too long, or the type is not modelled.
        """
        if name in self.sets:
            raise IpsetError(f"set {name} already exists")
        if not name or len(name) > 31:
            raise IpsetError(f"set name {name!r} must be 1..31 characters")
        stype = TYPES.get(type_name)
        if stype is None:
            raise IpsetError(f"set type {type_name!r} is not modelled; expected one of {sorted(TYPES)}")
        if stype.is_bitmap and not any(k == "range" for k, _ in options):
            raise IpsetError(f"bitmap:port set {name} needs 'range FROM-TO'")
        s = IpSet(name=name, stype=stype, family=family, options=options)
        self.sets[name] = s
        return s

    def get(self, name: str) -> IpSet:
        """The set with this name.

        Raises:
            IpsetError: no such set.
        """
        s = self.sets.get(name)
        if s is None:
            raise IpsetError(f"the set with the given name {name!r} does not exist")
        return s

    def destroy(self, name: str) -> None:
        """``ipset destroy NAME``."""
        self.get(name)
        del self.sets[name]

    def lookup(self, name: str, keys: tuple[tuple[str, int, str], ...]) -> bool | None:
        """``SetLookup`` for ``emulation.netfilter``: membership, or ``None`` when no such set."""
        s = self.sets.get(name)
        return None if s is None else s.match(keys)
