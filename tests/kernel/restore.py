"""Restoring one ``iptables-restore`` text and reading it back, on either executor.

:class:`EmulatedRestorer` loads the text with :func:`emulation.netfilter.load`, strict and
lenient (the two must agree, or the test fails naming both), and prints it with
:func:`emulation.netfilter.save`; :class:`LinuxRestorer` feeds it to the real
``iptables-restore`` / ``ip6tables-restore`` (or their ``-legacy`` x_tables twins) in a network
namespace the caller created, reads it back with the matching ``-save`` tool, and then empties
every table the text named (``-F`` and ``-X``), so one namespace serves a whole module.

Both return a :class:`Restored`: whether the text was loaded, the ``-A`` lines saved after it,
and the refusal's message (the emulator's :class:`~emulation.errors.NetfilterError`, or the
tool's stderr, whose wording differs between the nf_tables and legacy backends and is never
compared).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Protocol

from emulation.errors import NetfilterError
from emulation.netfilter import load, save
from tests.kernel.netns import sh


@dataclass(frozen=True, slots=True, kw_only=True)
class Restored:
    """The outcome of one restore.

    Attributes:
        loaded: the text was accepted (a refused text loads nothing).
        rules: the ``-A`` lines of the tables the text named, as the save tool prints them
            after the restore (empty when refused).
        error: the refusal's message; empty when loaded.
        line, text: the refused line (1-based) and its text, where the executor reports them
            reliably (the emulator); None otherwise.
    """

    loaded: bool
    rules: tuple[str, ...] = ()
    error: str = ""
    line: int | None = None
    text: str | None = None


class Restorer(Protocol):
    """Something that restores a text and reads it back (see the module docstring)."""

    name: str

    def restore(self, text: str, *, version: int) -> Restored:
        """Restore ``text`` (``iptables-restore`` format) into IP ``version`` 4 or 6."""
        ...


def saved_rules(text: str) -> tuple[str, ...]:
    """The ``-A`` lines of a save text, in order."""
    return tuple(line for line in text.splitlines() if line.startswith("-A"))


def tables_of(text: str) -> tuple[str, ...]:
    """The tables a restore text names (``*nat`` ...), in order."""
    return tuple(line[1:].strip() for line in text.splitlines() if line.startswith("*"))


class EmulatedRestorer:
    """The emulator's ``load`` and ``save``, strict and lenient at once."""

    name = "emulated"

    def restore(self, text: str, *, version: int) -> Restored:
        """Load ``text`` strict and lenient; both must reach the same outcome."""
        strict, lenient = (self._one(text, version, strict=s) for s in (True, False))
        assert strict == lenient, f"strict load gave {strict}, lenient {lenient}"
        return strict

    @staticmethod
    def _one(text: str, version: int, *, strict: bool) -> Restored:
        try:
            ruleset = load(text, version=version, strict=strict)
        except NetfilterError as e:
            return Restored(loaded=False, error=str(e), line=e.line, text=e.text)
        saved = save(ruleset)
        assert load(saved, version=version, strict=strict) == ruleset, f"save does not load back:\n{saved}"
        return Restored(loaded=True, rules=saved_rules(saved))


class LinuxRestorer:
    """The real tools in the namespace ``ns``; ``legacy`` picks ``iptables-legacy-restore``."""

    def __init__(self, ns: str, *, legacy: bool = False) -> None:
        self.ns = ns
        self.legacy = legacy
        self.name = "linux-legacy" if legacy else "linux"

    def _tool(self, version: int, action: str = "") -> str:
        base = "iptables" if version == 4 else "ip6tables"
        return base + ("-legacy" if self.legacy else "") + (f"-{action}" if action else "")

    def restore(self, text: str, *, version: int) -> Restored:
        """``iptables-restore`` the text, ``iptables-save`` its tables, then empty them."""
        proc = subprocess.run(
            ["ip", "netns", "exec", self.ns, self._tool(version, "restore")],
            input=text, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        tables = tables_of(text)
        try:
            if proc.returncode != 0:
                return Restored(loaded=False, error=proc.stderr.strip())
            rules: list[str] = []
            for table in tables:
                out = sh("ip", "netns", "exec", self.ns, self._tool(version, "save"), "-t", table).stdout
                rules.extend(saved_rules(out))
            return Restored(loaded=True, rules=tuple(rules))
        finally:
            for table in tables:
                for flag in ("-F", "-X"):
                    sh("ip", "netns", "exec", self.ns, self._tool(version), "-t", table, flag, check=False)
