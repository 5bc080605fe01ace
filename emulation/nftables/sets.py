"""Set and map commands of a transaction: ``add set``/``add map`` and their block-form
declarations (``type``, ``flags``, ``timeout``, ``size``, ``comment``, ``elements``), ``add``/
``delete``/``destroy element`` and ``flush``/``delete`` of a set or map.

As nf_tables_api.c: an element's verdict must name an existing chain (``ENOENT``),
deleting a missing element fails unless ``destroy``, and a set still used by a rule cannot be
deleted (``EBUSY``). A set with the ``counter`` statement counts per element.
"""

from __future__ import annotations

from emulation.errors import InputError
from emulation.nftables import exprs as ex
from emulation.nftables import rule_parse as rp
from emulation.nftables.model import Element, SetFlag, TableSet
from emulation.nftables.tokens import NEWLINE, Token
from emulation.nftables.types import Datum, Verdict, parse_key
from emulation.nftables.work import Cursor, WSet, WTable, parse_duration, refs

__all__ = ["SetCommands"]


class SetCommands(Cursor):
    """The set and map commands (a base of the transaction parser)."""

    def cmd_set(self, word: str, table: WTable, name: str) -> None:
        self.set_cmd(word, table, name, is_map=False)

    def cmd_map(self, word: str, table: WTable, name: str) -> None:
        self.set_cmd(word, table, name, is_map=True)

    def set_cmd(self, word: str, table: WTable, name: str, *, is_map: bool) -> None:
        if word in ("add", "create"):
            self.set_decl(table, name, is_map, create=word == "create")
            return
        ws = table.sets.get(name)
        if ws is None:
            if word == "destroy":
                return
            raise InputError(
                f"no such {'map' if is_map else 'set'} {name} in table {table.family} {table.name}"
            )
        if word == "flush":
            ws.elements.clear()
            return
        for chain in table.chains.values():
            for rule in chain.rules:
                if name in refs(rule.stmts)[1]:
                    raise InputError(f"set {name} is still used by a rule in chain {chain.spec.name} (EBUSY)")
        del table.sets[name]

    # --- sets, maps and elements -----------------------------------------------------------------

    def set_decl(self, table: WTable, name: str, is_map: bool, *, create: bool) -> None:
        existing = table.sets.get(name)
        if existing is not None and create:
            raise InputError(f"set {name} exists already (create)")
        self.expect("{")
        spec = existing.spec if existing else None
        keys: tuple[str, ...] = spec.key_types if spec else ()
        data = spec.data_type if spec else None
        flags: set[SetFlag] = set(spec.flags) if spec else set()
        timeout = spec.timeout_s if spec else None
        size = spec.size if spec else None
        comment = spec.comment if spec else None
        counter = spec.counter if spec else False
        pending: list[Token] | None = None
        while True:
            self.skip_ends()
            word = self.take()
            if word == "}":
                break
            if word == "type":
                parts = [self.take()]
                while self.peek() == ".":
                    self.take()
                    parts.append(self.take())
                keys = tuple(parts)
                if self.peek() == ":":
                    self.take()
                    dparts = [self.take()]
                    while self.peek() == ".":
                        self.take()
                        dparts.append(self.take())
                    data = " . ".join(dparts)
            elif word == "flags":
                flags.add(SetFlag(self.take()))
                while self.peek() == ",":
                    self.take()
                    flags.add(SetFlag(self.take()))
            elif word == "timeout":
                timeout = parse_duration(self.take())
            elif word == "size":
                size = int(self.take())
            elif word == "counter":
                counter = True
            elif word == "comment":
                comment = self.take().strip('"')
            elif word == "elements":
                self.expect("=")
                start = self.pos
                self.skip_braces()
                pending = self.toks[start : self.pos]
            elif word in ("policy", "gc-interval"):
                self.take()
            elif word == "auto-merge":
                pass
            else:
                raise InputError(f"unexpected {word!r} in set {name}")
        if not keys:
            raise InputError(f"set {name} has no type")
        for k in keys:
            if k not in ex.SELECTORS.values() and k not in (
                "ipv4_addr",
                "ipv6_addr",
                "inet_proto",
                "inet_service",
                "mark",
                "ifname",
                "integer",
            ):
                raise InputError(f"unknown set key type {k!r} in set {name}")
        if is_map and data is None:
            raise InputError(f"map {name} has no data type (type KEY : DATA)")
        new = TableSet(
            name=name,
            key_types=keys,
            data_type=data,
            flags=frozenset(flags),
            timeout_s=timeout,
            size=size,
            counter=counter,
            comment=comment,
        )
        if existing is None:
            self.work.created_sets.add((table.family, table.name, name))
            table.handle()
            existing = table.sets[name] = WSet(new)
        existing.spec = new
        if pending is not None:
            self.elements(table, existing, pending, add=True, check=False)

    def skip_braces(self) -> None:
        depth = 0
        while True:
            t = self.take()
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if depth == 0:
                    return

    def cmd_element(self, word: str, table: WTable, name: str) -> None:
        ws = table.sets.get(name)
        if ws is None:
            raise InputError(f"no such set or map {name} in table {table.family} {table.name}")
        start = self.pos
        self.skip_braces()
        self.elements(
            table,
            ws,
            self.toks[start : self.pos],
            add=word in ("add", "create"),
            check=True,
            missing_ok=word == "destroy",
        )

    def elements(
        self,
        table: WTable,
        ws: WSet,
        toks: list[Token],
        *,
        add: bool,
        check: bool,
        missing_ok: bool = False,
    ) -> None:
        s = rp.Stream([t for t in toks if t.text != NEWLINE][1:-1])
        spec = ws.spec
        while not s.done:
            key = tuple(
                rp.parse_value(k, v)
                for k, v in zip(spec.key_types, self._concat(s, len(spec.key_types)), strict=True)
            )
            comment = None
            timeout = spec.timeout_s
            packets = octets = 0
            while s.peek() in ("comment", "timeout", "expires", "counter"):
                w = s.take()
                if w == "comment":
                    comment = s.take().strip('"')
                elif w == "timeout":
                    timeout = parse_duration(s.take())
                elif w == "expires":
                    s.take()
                elif s.peek() == "packets":
                    s.take()
                    packets = int(s.take())
                    s.expect("bytes")
                    octets = int(s.take())
            datum: Datum | None = None
            if s.peek() == ":":
                s.take()
                datum = self._datum(s, spec)
            if s.peek() == ",":
                s.take()
            if add:
                if spec.is_map and datum is None:
                    raise InputError(f"an element of map {spec.name} needs ': DATA'")
                if (
                    check
                    and isinstance(datum, Verdict)
                    and datum.chain is not None
                    and datum.chain not in table.chains
                ):
                    raise InputError(f"no such chain {datum.chain!r} for an element of map {spec.name}")
                # A static element's timeout is not modelled (nothing here has a clock); it stays.
                del timeout
                ws.elements[key] = Element(
                    key=key, data=datum, comment=comment, packets=packets, bytes=octets
                )
            elif key in ws.elements:
                del ws.elements[key]
            elif not missing_ok:
                raise InputError(f"no such element in set {spec.name} (delete element)")

    @staticmethod
    def _concat(s: rp.Stream, n: int) -> list[str]:
        parts = [s.take()]
        for _ in range(n - 1):
            s.expect(".")
            parts.append(s.take())
        return parts

    @staticmethod
    def _datum(s: rp.Stream, spec: TableSet) -> Datum:
        assert spec.data_type is not None
        if spec.data_type == "verdict":
            return rp.parse_verdict(s)
        kinds = spec.data_type.split(" . ")
        return tuple(parse_key(k, v) for k, v in zip(kinds, SetCommands._concat(s, len(kinds)), strict=True))
