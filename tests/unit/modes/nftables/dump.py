# ruff: noqa: E501  (nft rule text is kept whole on one line, to be read as nft prints it)
"""The state an ``add``-form transaction leaves, printed as knftables' ``Fake.Dump`` prints it.

kube-proxy's nftables tests compare ``nft.Dump()`` (the fake kernel's state after every
transaction so far) with an expected ruleset. :class:`Dump` applies our transactions line by line
with the semantics knftables' fake gives them (``add`` creates or keeps, ``flush`` empties a chain
of rules or a set of elements, ``delete`` removes; deleting something missing is an error, as in
the kernel), so the same comparison can be made here. It reads only the line shapes the renderer
writes and refuses any other.
"""

from __future__ import annotations

import re

_LINE = re.compile(r"^(add|flush|delete) (table|chain|rule|set|map|element) (ip6?) kube-proxy ?(\S*)(?: (.*))?$")


def _items(body: str) -> list[str]:
    """The elements of ``{ E1 , E2 }`` (one line may hold many, as the renderer groups them)."""
    return [item.strip() for item in body.strip()[1:-1].split(" , ")]


class Dump:
    """The fake kernel's table, fed with :meth:`apply`."""

    def __init__(self) -> None:
        self.table = ""
        self.chains: dict[str, str] = {}
        self.rules: dict[str, list[str]] = {}
        self.sets: dict[str, tuple[str, str]] = {}
        self.elements: dict[str, dict[str, str]] = {}

    def apply(self, text: str) -> None:
        """Apply every line of ``text``.

        Raises:
            ValueError: a line of an unknown shape, or a delete or flush of a missing object.
        """
        for line in text.splitlines():
            m = _LINE.match(line)
            if not m:
                raise ValueError(f"unexpected transaction line {line!r}")
            verb, kind, family, name, rest = m.groups()
            self.family = family
            getattr(self, f"_{verb}")(kind, name, rest or "", line)

    def _add(self, kind: str, name: str, rest: str, line: str) -> None:
        if kind == "table":
            self.table = line
        elif kind == "chain":
            if rest or name not in self.chains:
                self.chains[name] = rest
            self.rules.setdefault(name, [])
        elif kind == "rule":
            if name not in self.chains:
                raise ValueError(f"rule for a missing chain: {line}")
            self.rules[name].append(rest)
        elif kind in ("set", "map"):
            self.sets.setdefault(name, (kind, rest))
            self.elements.setdefault(name, {})
        else:
            if name not in self.elements:
                raise ValueError(f"element for a missing set: {line}")
            for item in _items(rest):
                key = item.split(" : ")[0].split(' comment "')[0]
                self.elements[name][key] = f"{{ {item} }}"

    def _flush(self, kind: str, name: str, rest: str, line: str) -> None:
        target = self.rules if kind == "chain" else self.elements
        if name not in target:
            raise ValueError(f"flush of a missing {kind}: {line}")
        target[name].clear()

    def _delete(self, kind: str, name: str, rest: str, line: str) -> None:
        if kind == "chain":
            if name not in self.chains:
                raise ValueError(f"delete of a missing chain: {line}")
            del self.chains[name], self.rules[name]
        elif kind in ("set", "map"):
            if name not in self.sets:
                raise ValueError(f"delete of a missing {kind}: {line}")
            del self.sets[name], self.elements[name]
        else:
            for key in _items(rest):
                if key not in self.elements.get(name, {}):
                    raise ValueError(f"delete of a missing element: {line}")
                del self.elements[name][key]

    def text(self) -> str:
        """The state as ``add`` lines (knftables' ``Fake.Dump``)."""
        where = f"{self.family} kube-proxy"
        out = [self.table]
        for chain, spec in self.chains.items():
            out.append(f"add chain {where} {chain}" + (f" {spec}" if spec else ""))
            out.extend(f"add rule {where} {chain} {rule}" for rule in self.rules[chain])
        for name, (kind, spec) in self.sets.items():
            out.append(f"add {kind} {where} {name} {spec}")
            out.extend(f"add element {where} {name} {el}" for el in self.elements[name].values())
        return "\n".join(out) + "\n"

    def operations(self, text: str) -> int:
        """How many operations ``text`` holds (one per line, and one per element)."""
        return sum(len(_items(line.split(" ", 5)[5])) if line.split(" ", 2)[1] == "element" else 1
                   for line in text.splitlines())
