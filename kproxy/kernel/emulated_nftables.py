"""The emulated nftables kernel: an :class:`emulation.nftables.Netns` behind :class:`NftablesKernel`.

Theory of operation: a thin adapter. :meth:`EmulatedNftables.run` hands the transaction to
:meth:`emulation.nftables.Netns.apply`, which computes the new ruleset and swaps it in only when
every line was accepted, as the kernel's nf_tables transaction commits or aborts as a whole
(``nf_tables_commit``/``nf_tables_abort``); rule counters of rules that stay are kept.
:meth:`~EmulatedNftables.list_ruleset` prints the family's ``kube-proxy`` table as ``nft list
table`` does (live counters included); conntrack deletion works on the namespace's emulated
conntrack table with the same filters :class:`~kproxy.kernel.LinuxNftables` passes to
``conntrack -D``.

The namespace may hold other tables (a CNI's ``inet`` filter table, an iptables-nft table):
they are the node's, and this adapter never touches them, as kube-proxy's transactions only
name its own table.

Every coroutine here finishes without suspending, so a sync over this kernel can be run to
completion synchronously with :func:`~kproxy.kernel.emulated.run_now`.
"""

from __future__ import annotations

from collections.abc import Sequence

from emulation import ManualClock
from emulation.nftables import Family, Netns, NftablesError, Ruleset, list_ruleset
from kproxy.errors import KernelError
from kproxy.kernel.conntrack import ConntrackFilter
from kproxy.kernel.netfilter import failing_line
from kproxy.kernel.node import trace_node
from kproxy.model.names import IPFamily

__all__ = ["TABLE_NAME", "EmulatedNftables", "emulated_nftables"]

#: The table kube-proxy's nftables proxier owns, in the ``ip`` and ``ip6`` families.
TABLE_NAME = "kube-proxy"


def _family(family: IPFamily) -> Family:
    return Family.IP6 if family is IPFamily.IPv6 else Family.IP


class EmulatedNftables:
    """One IP family's ``kube-proxy`` table in an emulated network namespace.

    Args:
        netns: the emulated namespace (several adapters, one per family, may share it).
        family: IPv4 (table ``ip kube-proxy``) or IPv6 (``ip6 kube-proxy``).
        strict: refuse expressions the emulator does not model (the default; kproxy renders
            only modelled ones), rather than loading them as unknown statements.
    """

    def __init__(self, netns: Netns, family: IPFamily = IPFamily.IPv4, *, strict: bool = True) -> None:
        self.netns = netns
        self.family = family
        self.strict = strict
        self.transactions = 0
        """How many non-empty transactions were committed."""

    async def run(self, transaction: str) -> None:
        """Apply ``transaction`` (``nft -f`` input) atomically; an empty one is not run.

        Raises:
            KernelError: the emulator refused a line (the message names and quotes it); nothing
                changed.
        """
        if not transaction.strip():
            return
        try:
            self.netns.apply(transaction, strict=self.strict)
        except NftablesError as err:
            number = _line_of(str(err))
            shown = failing_line(transaction, number)
            where = f"; failing line: {shown}" if shown else ""
            raise KernelError(f"nft -f failed: {err}{where}") from err
        self.transactions += 1

    async def list_ruleset(self) -> str:
        """``nft list table FAMILY kube-proxy`` with live counters; ``""`` when there is no table."""
        key = (_family(self.family), TABLE_NAME)
        table = self.netns.ruleset.tables.get(key)
        if table is None:
            return ""
        return list_ruleset(Ruleset(tables={key: table}), counters=self.netns.counters(),
                            element_counters=self.netns.element_counted)

    async def clear_conntrack(self, filters: Sequence[ConntrackFilter]) -> int:
        """Delete the emulated conntrack entries matching any of ``filters`` (``conntrack -D``);
        return how many were deleted."""
        if not filters:
            return 0
        return self.netns.conntrack.delete(lambda entry: any(f.matches(entry) for f in filters))


def _line_of(message: str) -> int | None:
    """The ``N`` of an emulator error's ``line N:`` prefix, if any."""
    head, sep, _ = message.partition(":")
    if sep and head.startswith("line ") and head[5:].strip().isdigit():
        return int(head[5:])
    return None


def emulated_nftables(node_ips: Sequence[str], family: IPFamily, *,
                      netns: Netns | None = None) -> EmulatedNftables:
    """An :class:`EmulatedNftables` over ``netns``, or over a fresh namespace of
    :func:`~kproxy.kernel.node.trace_node` (``route_localnet`` off: the nftables proxier never
    sets it, KEP-3866) with a manual clock.

    Raises:
        ConfigError: a node IP is not an IP address.
    """
    if netns is None:
        netns = Netns(trace_node(node_ips, route_localnet=False), ManualClock())
    return EmulatedNftables(netns, family)
