"""The emulated kernel: an :class:`emulation.netfilter.Netns` programmed as kube-proxy programs a node.

Theory of operation: :meth:`EmulatedKernel.load` computes the new ruleset from the current one
entirely in memory (ensure the jump chains and rules on a full sync, then ``iptables-restore
--noflush --counters`` of the text) and swaps it in only when every step succeeded, so a failure
leaves the namespace exactly as it was (rules, counters, ``recent`` lists and conntrack untouched).
nfacct objects are kept as a set of names: a rule naming one that does not exist is refused, as
the kernel refuses to load it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from emulation.errors import NetfilterError
from emulation.netfilter import Netns, Ruleset, apply_restore, parse_rule
from kproxy.errors import KernelError
from kproxy.kernel.base import ENSURED_JUMPS, failing_line
from kproxy.kernel.conntrack import ConntrackFilter
from kproxy.model.names import IPFamily
from kproxy.modes.iptables import JumpRule, RenderResult

__all__ = ["NFACCT_NAME_MAX", "EmulatedKernel", "ensure_jumps"]

#: The kernel's limit on an nfacct object's name (``NFACCT_NAME_MAX`` - 1).
NFACCT_NAME_MAX = 31
_NFACCT_USE = re.compile(r"--nfacct-name\s+(\S+)")


def _jump_exists(ruleset: Ruleset, jump: JumpRule) -> bool:
    chain = ruleset.chain(jump.table, jump.chain)
    if chain is None:
        return False
    wanted = parse_rule(jump.chain, jump.argv, table=jump.table, version=ruleset.version, strict=False,
                        is_chain=lambda _name: True).spec()
    return any(rule.spec() == wanted for rule in chain.rules)


def ensure_jumps(ruleset: Ruleset, jumps: Iterable[JumpRule] = ENSURED_JUMPS) -> Ruleset:
    """``ruleset`` after kube-proxy's ``EnsureChain`` + ``EnsureRule(Prepend)`` of each jump.

    A missing target chain is created empty; a rule already present (same canonical spec) is
    left where it is; a missing one is inserted first in its built-in chain.

    Raises:
        NetfilterError: a jump the emulator cannot parse (never for kube-proxy's own).
    """
    state = ruleset
    for jump in jumps:
        if state.chain(jump.table, jump.target) is None:
            state = apply_restore(state, f"*{jump.table}\n:{jump.target} - [0:0]\nCOMMIT\n", noflush=True)
        if not _jump_exists(state, jump):
            state = apply_restore(state, f"*{jump.table}\n{jump.restore_line()}\nCOMMIT\n", noflush=True)
    return state


class EmulatedKernel:
    """Applies iptables-mode results to an emulated network namespace.

    Args:
        netns: the emulated namespace; its ``ruleset.version`` must match ``family``.
        family: the IP family written (None: taken from the namespace's ruleset); a mismatch
            with the namespace raises :class:`KernelError` on the first load.
    """

    def __init__(self, netns: Netns, family: IPFamily | None = None) -> None:
        version = netns.ruleset.version
        self.netns = netns
        self.family: IPFamily = family or (IPFamily.IPv6 if version == 6 else IPFamily.IPv4)
        self.nfacct_objects: set[str] = set()
        self.applied = 0
        """How many results were applied successfully."""

    async def apply(self, result: RenderResult, *, nfacct: Sequence[str] = ()) -> None:
        """Async form of :meth:`load` (the :class:`~kproxy.kernel.base.IptablesApplier` protocol).

        Raises:
            KernelError: see :meth:`load`.
        """
        self.load(result, nfacct=nfacct)

    def load(self, result: RenderResult, *, nfacct: Sequence[str] = ()) -> None:
        """Program ``result`` atomically (see the module docstring).

        Args:
            result: the render to apply.
            nfacct: nfacct object names to create first on a full result (``nfacct_counters``).

        Raises:
            KernelError: the text does not restore (the message names the line and quotes it),
                it names an nfacct object that does not exist, or the family is wrong. Nothing
                changed.
        """
        want = 6 if self.family is IPFamily.IPv6 else 4
        if self.netns.ruleset.version != want:
            raise KernelError(f"the emulated namespace holds IPv{self.netns.ruleset.version} rules, "
                              f"not {self.family}; build it with Ruleset({want})")
        names = set(self.nfacct_objects)
        if result.full:
            for name in nfacct:
                if not 0 < len(name) <= NFACCT_NAME_MAX:
                    raise KernelError(f"nfacct object name {name!r}: 1 to {NFACCT_NAME_MAX} characters")
                names.add(name)
        for number, line in enumerate(result.text.splitlines(), 1):
            for used in _NFACCT_USE.findall(line):
                if used not in names:
                    raise KernelError(f"iptables-restore: line {number} failed: nfacct object {used!r} "
                                      f"does not exist (create it first): {line}")
        state = self.netns.ruleset
        if result.full:
            try:
                state = ensure_jumps(state)
            except NetfilterError as err:
                raise KernelError(f"ensuring kube-proxy's jump rules failed: {err}") from err
        try:
            state = apply_restore(state, result.text, noflush=True, counters=True)
        except NetfilterError as err:
            shown = failing_line(result.text, err.line)
            where = f"; line: {shown}" if shown else ""
            raise KernelError(f"iptables-restore failed: {err}{where}") from err
        self.netns.ruleset = state
        self.nfacct_objects = names
        self.applied += 1

    async def clear_conntrack(self, filters: Sequence[ConntrackFilter]) -> int:
        """Delete the emulated conntrack entries matching any of ``filters`` (``conntrack -D``,
        as :class:`~kproxy.kernel.linux.LinuxKernel` does); return how many were deleted."""
        if not filters:
            return 0
        return self.netns.conntrack.delete(lambda entry: any(f.matches(entry) for f in filters))

    async def existing_chains(self) -> frozenset[str]:
        """The nat table's chains now."""
        table = self.netns.ruleset.tables.get("nat")
        return frozenset(table.chains) if table is not None else frozenset()

    def save(self, *, counters: bool = False) -> str:
        """``iptables-save [-c]`` of the namespace."""
        return self.netns.save(counters=counters)
