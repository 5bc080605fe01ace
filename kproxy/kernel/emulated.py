"""The emulated netfilter kernel: an :class:`emulation.netfilter.Netns` behind :class:`NetfilterKernel`.

Theory of operation: each operation computes the new ruleset from the current one in memory
(``iptables -N``, ``-C``/``-I``, ``iptables-restore --noflush --counters``) and swaps it in only
when it succeeded, so a refused restore leaves the namespace exactly as it was (rules, counters,
``recent`` lists and conntrack untouched), as the kernel's atomic table replacement does. nfacct
objects are kept as a set of names: a restore whose rules name one that does not exist is
refused, as the kernel refuses to load it. Sysctls are recorded; ``route_localnet`` is also set
on the node model.

Every coroutine here finishes without suspending, so a mode's sync over this kernel can be run
to completion synchronously with :func:`run_now` (``kproxy trace`` builds its nodes so).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, TypeVar

from emulation.errors import NetfilterError
from emulation.netfilter import Netns, apply_restore, parse_rule
from kproxy.errors import KernelError
from kproxy.kernel.conntrack import ConntrackFilter
from kproxy.kernel.netfilter import ROUTE_LOCALNET, failing_line, quote_argument
from kproxy.model.names import IPFamily

__all__ = ["NFACCT_NAME_MAX", "EmulatedNetfilter", "run_now"]

#: The kernel's limit on an nfacct object's name (``NFACCT_NAME_MAX`` - 1).
NFACCT_NAME_MAX = 31
_NFACCT_USE = re.compile(r"--nfacct-name\s+(\S+)")
_T = TypeVar("_T")


def run_now(awaitable: Awaitable[_T]) -> _T:
    """Run a coroutine that never suspends (a sync over an emulated kernel) to its result.

    Raises:
        KernelError: the coroutine suspended, i.e. it waited for real I/O (a Linux kernel).
    """
    coro: Coroutine[Any, Any, _T] = awaitable  # type: ignore[assignment]
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise KernelError("run_now: the operation waited for I/O; await it in an event loop instead")


class EmulatedNetfilter:
    """One IP family's tables of an emulated network namespace.

    Args:
        netns: the emulated namespace; its ``ruleset.version`` must match ``family``.
        family: the IP family written (None: taken from the namespace's ruleset); a mismatch
            with the namespace raises :class:`KernelError` at the first operation.
    """

    def __init__(self, netns: Netns, family: IPFamily | None = None) -> None:
        version = netns.ruleset.version
        self.netns = netns
        self.family: IPFamily = family or (IPFamily.IPv6 if version == 6 else IPFamily.IPv4)
        self.nfacct_objects: set[str] = set()
        self.sysctls: dict[str, str] = {}
        self.restores = 0
        """How many restores succeeded."""

    def _check_family(self) -> None:
        want = 6 if self.family is IPFamily.IPv6 else 4
        if self.netns.ruleset.version != want:
            raise KernelError(f"the emulated namespace holds IPv{self.netns.ruleset.version} rules, "
                              f"not {self.family}; build it with Ruleset({want})")

    def _restore(self, text: str, *, what: str) -> None:
        try:
            self.netns.ruleset = apply_restore(self.netns.ruleset, text, noflush=True)
        except NetfilterError as err:
            raise KernelError(f"{what} failed: {err}") from err

    async def ensure_chain(self, table: str, chain: str) -> None:
        """``iptables -t TABLE -N CHAIN`` unless it exists (see :class:`NetfilterKernel`).

        Raises:
            KernelError: the namespace is of the other family, or the name is refused.
        """
        self._check_family()
        if self.netns.ruleset.chain(table, chain) is None:
            self._restore(f"*{table}\n:{chain} - [0:0]\nCOMMIT\n", what=f"creating chain {table}/{chain}")

    async def ensure_rule(self, table: str, chain: str, argv: Sequence[str]) -> bool:
        """``iptables -C`` then ``-I`` (see :class:`NetfilterKernel`); an equal canonical spec is "there".

        Raises:
            KernelError: the rule does not parse or names a missing chain.
        """
        self._check_family()
        ruleset = self.netns.ruleset
        existing = ruleset.chain(table, chain)
        if existing is not None:
            try:
                wanted = parse_rule(chain, tuple(argv), table=table, version=ruleset.version, strict=False,
                                    is_chain=lambda _name: True).spec()
            except NetfilterError as err:
                raise KernelError(f"checking a rule in {table}/{chain} failed: {err}") from err
            if any(rule.spec() == wanted for rule in existing.rules):
                return True
        line = " ".join(("-I", chain, *(quote_argument(a) for a in argv)))
        self._restore(f"*{table}\n{line}\nCOMMIT\n", what=f"inserting {line!r} into {table}/{chain}")
        return False

    async def delete_rule(self, table: str, chain: str, argv: Sequence[str]) -> bool:
        """``iptables -D`` when an equal rule (canonical spec) is there (see :class:`NetfilterKernel`).

        Raises:
            KernelError: the rule does not parse, or the namespace is of the other family.
        """
        self._check_family()
        ruleset = self.netns.ruleset
        existing = ruleset.chain(table, chain)
        if existing is None:
            return False
        try:
            wanted = parse_rule(chain, tuple(argv), table=table, version=ruleset.version, strict=False,
                                is_chain=lambda _name: True).spec()
        except NetfilterError as err:
            raise KernelError(f"checking a rule in {table}/{chain} failed: {err}") from err
        if not any(rule.spec() == wanted for rule in existing.rules):
            return False
        line = " ".join(("-D", chain, *(quote_argument(a) for a in argv)))
        self._restore(f"*{table}\n{line}\nCOMMIT\n", what=f"deleting {line!r} from {table}/{chain}")
        return True

    async def restore(self, text: str, *, noflush: bool = True, counters: bool = True) -> None:
        """``iptables-restore`` of ``text``, atomic (see the module docstring).

        Raises:
            KernelError: the text does not restore (the message names the line and quotes it),
                it names an nfacct object that does not exist, or the family is wrong. Nothing
                changed.
        """
        self._check_family()
        for number, line in enumerate(text.splitlines(), 1):
            for used in _NFACCT_USE.findall(line):
                if used not in self.nfacct_objects:
                    raise KernelError(f"iptables-restore: line {number} failed: nfacct object {used!r} "
                                      f"does not exist (create it first): {line}")
        try:
            state = apply_restore(self.netns.ruleset, text, noflush=noflush, counters=counters)
        except NetfilterError as err:
            shown = failing_line(text, err.line)
            where = f"; line: {shown}" if shown else ""
            raise KernelError(f"iptables-restore failed: {err}{where}") from err
        self.netns.ruleset = state
        self.restores += 1

    async def list_chains(self, table: str) -> frozenset[str]:
        """The chains of ``table`` now (empty when the namespace has no such table)."""
        found = self.netns.ruleset.tables.get(table)
        return frozenset(found.chains) if found is not None else frozenset()

    async def ensure_sysctl(self, name: str, value: str) -> None:
        """Record ``name = value``; ``route_localnet=1`` also turns it on in the node model."""
        self.sysctls[name] = value
        if name == ROUTE_LOCALNET and value == "1" and not self.netns.node.route_localnet:
            self.netns.node = dataclasses.replace(self.netns.node, route_localnet=True)

    async def create_nfacct(self, name: str) -> None:
        """Create the nfacct object ``name`` (kept by name).

        Raises:
            KernelError: the name is empty or longer than :data:`NFACCT_NAME_MAX`.
        """
        if not 0 < len(name) <= NFACCT_NAME_MAX:
            raise KernelError(f"nfacct object name {name!r}: 1 to {NFACCT_NAME_MAX} characters")
        self.nfacct_objects.add(name)

    async def clear_conntrack(self, filters: Sequence[ConntrackFilter]) -> int:
        """Delete the emulated conntrack entries matching any of ``filters`` (``conntrack -D``,
        as :class:`~kproxy.kernel.linux.LinuxNetfilter` does); return how many were deleted."""
        if not filters:
            return 0
        return self.netns.conntrack.delete(lambda entry: any(f.matches(entry) for f in filters))

    def save(self, *, counters: bool = False) -> str:
        """``iptables-save [-c]`` of the namespace."""
        return self.netns.save(counters=counters)
