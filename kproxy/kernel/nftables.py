"""The narrow nftables interface the nftables mode programs through, and its Linux implementation.

As knftables' ``Interface`` (``sigs.k8s.io/knftables``) is narrow, so is :class:`NftablesKernel`:
run a transaction (``nft -f``), list the family's ``kube-proxy`` table, and delete conntrack
entries. What to write when (full or partial sync, stale chains) is the mode's business
(:mod:`kproxy.modes.nftables`), never a kernel's.

:class:`LinuxNftables` runs ``nft -f -`` with the transaction on stdin, in the current network
namespace or in ``ip netns exec NETNS``, as root. A transaction is atomic in the kernel: when
``nft`` refuses a line nothing changes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from kproxy.errors import KernelError
from kproxy.kernel.conntrack import ConntrackFilter
from kproxy.kernel.linux import LinuxNetfilter
from kproxy.kernel.netfilter import failing_line
from kproxy.model.names import IPFamily

__all__ = ["LinuxNftables", "NftablesKernel", "nft_family", "table_objects"]

_LINE = re.compile(r":(\d+):\d+(?:-\d+)?: Error")
_OBJECT = re.compile(r"^\t(chain|set|map) (\S+) \{$", re.M)


def nft_family(family: IPFamily) -> str:
    """The nftables family of kube-proxy's table for ``family``: ``ip`` or ``ip6``."""
    return "ip6" if family is IPFamily.IPv6 else "ip"


def table_objects(listing: str) -> tuple[frozenset[str], frozenset[str]]:
    """``(chains, sets)`` named in one ``nft list table`` output (maps count as sets)."""
    chains: set[str] = set()
    sets: set[str] = set()
    for kind, name in _OBJECT.findall(listing):
        (chains if kind == "chain" else sets).add(name)
    return frozenset(chains), frozenset(sets)


@runtime_checkable
class NftablesKernel(Protocol):
    """One IP family's nftables, emulated or real.

    Attributes:
        family: the IP family of the ``kube-proxy`` table programmed (``ip`` or ``ip6``).
    """

    family: IPFamily

    async def run(self, transaction: str) -> None:
        """Apply ``transaction`` (``nft -f`` input) atomically.

        Raises:
            KernelError: nft refused it (naming the failing line); nothing changed.
        """
        ...

    async def list_ruleset(self) -> str:
        """``nft list table FAMILY kube-proxy`` as nft prints it; ``""`` when there is no table.

        Raises:
            KernelError: the table could not be read.
        """
        ...

    async def clear_conntrack(self, filters: Sequence[ConntrackFilter]) -> int:
        """Delete the conntrack entries matching any of ``filters``; return how many went.

        Raises:
            KernelError: the deletion failed.
        """
        ...


class LinuxNftables:
    """The running kernel's nftables for one family (see the module docstring).

    Args:
        family: IPv4 (table ``ip kube-proxy``) or IPv6 (``ip6 kube-proxy``).
        netns: run inside ``ip netns exec NETNS`` (tests); None means the current namespace.
        timeout_s: seconds after which ``nft`` is killed and :class:`KernelError` raised.
    """

    def __init__(self, family: IPFamily = IPFamily.IPv4, *, netns: str | None = None,
                 timeout_s: float = 60.0) -> None:
        self.family = family
        self.netns = netns
        # The command runner (subprocess, timeout, netns prefix) and conntrack deletion are the
        # netfilter adapter's; nftables adds only its own commands.
        self._shell = LinuxNetfilter(family, netns=netns, timeout_s=timeout_s)

    async def run(self, transaction: str) -> None:
        """``nft -f -`` of ``transaction``; an empty one is not run.

        Raises:
            KernelError: with nft's error and the failing line of the input.
        """
        if not transaction.strip():
            return
        done = await self._shell.run("nft", "-f", "-", stdin=transaction)
        if done.returncode != 0:
            m = _LINE.search(done.stderr)
            shown = failing_line(transaction, int(m.group(1))) if m else ""
            raise KernelError(f"nft -f failed (exit {done.returncode}): {done.stderr.strip()}"
                              + (f"; failing line: {shown}" if shown else ""))

    async def list_ruleset(self) -> str:
        """``nft list table FAMILY kube-proxy``; ``""`` when the table does not exist.

        Raises:
            KernelError: nft failed for another reason.
        """
        done = await self._shell.run("nft", "list", "table", nft_family(self.family), "kube-proxy")
        if done.returncode != 0:
            if "No such file or directory" in done.stderr:
                return ""
            raise KernelError(f"nft list table failed (exit {done.returncode}): {done.stderr.strip()}")
        return done.stdout

    async def delete_table(self) -> bool:
        """``nft delete table FAMILY kube-proxy`` (kube-proxy's ``--cleanup``); False when there was none.

        Raises:
            KernelError: nft is missing or failed for another reason.
        """
        if not await self.list_ruleset():
            return False
        await self.run(f"delete table {nft_family(self.family)} kube-proxy\n")
        return True

    async def clear_conntrack(self, filters: Sequence[ConntrackFilter]) -> int:
        """``conntrack -D`` for each filter, as :meth:`LinuxNetfilter.clear_conntrack`.

        Raises:
            KernelError: the tool is missing or failed.
        """
        return await self._shell.clear_conntrack(filters)
