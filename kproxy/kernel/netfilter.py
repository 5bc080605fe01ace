"""The narrow netfilter interface every iptables-family mode programs through.

As kube-proxy's ``utiliptables.Interface`` (pkg/util/iptables/iptables.go) is narrow, so is
:class:`NetfilterKernel`: create a chain, prepend a rule unless present, delete a rule, restore a
text, list a table's chains, set a sysctl, create an nfacct object and delete conntrack entries. What to call
in which order (kube-proxy's ``syncProxyRules``: nfacct objects, then the jump chains and rules,
then the restore) is written once, in the mode (:mod:`kproxy.modes.iptables.mode`,
:mod:`kproxy.modes.ipvs.mode`), never in a kernel.

Two implementations: :class:`~kproxy.kernel.emulated.EmulatedNetfilter` (an
:class:`emulation.netfilter.Netns`, rootless) and :class:`~kproxy.kernel.linux.LinuxNetfilter`
(``iptables``/``iptables-restore`` in a network namespace, as root).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from kproxy.kernel.conntrack import ConntrackFilter
from kproxy.model.names import IPFamily

__all__ = ["ROUTE_LOCALNET", "NetfilterKernel", "failing_line", "quote_argument"]

#: kube-proxy's ``sysctlRouteLocalnet``, as ``sysctl`` names it.
ROUTE_LOCALNET = "net.ipv4.conf.all.route_localnet"


@runtime_checkable
class NetfilterKernel(Protocol):
    """One IP family's netfilter tables (``iptables`` or ``ip6tables``), emulated or real.

    Attributes:
        family: the IP family of the tables.
    """

    family: IPFamily

    async def ensure_chain(self, table: str, chain: str) -> None:
        """Create ``chain`` in ``table`` unless it exists (``iptables -N``; "exists" is fine).

        Raises:
            KernelError: the chain could not be created.
        """
        ...

    async def ensure_rule(self, table: str, chain: str, argv: Sequence[str]) -> bool:
        """Prepend the rule ``argv`` to ``chain`` unless an equal rule is there
        (``iptables -C`` then ``-I``, kube-proxy's ``EnsureRule(Prepend, ...)``).

        Returns:
            True when the rule was already there.

        Raises:
            KernelError: the rule could not be checked or inserted.
        """
        ...

    async def delete_rule(self, table: str, chain: str, argv: Sequence[str]) -> bool:
        """Delete the rule ``argv`` from ``chain`` when it is there (``iptables -D``, kube-proxy's
        ``DeleteRule``, which treats "not found" as done).

        Returns:
            True when a rule was deleted, False when there was none (or no such chain).

        Raises:
            KernelError: the rule was there but could not be deleted.
        """
        ...

    async def restore(self, text: str, *, noflush: bool = True, counters: bool = True) -> None:
        """``iptables-restore [--noflush] [--counters]`` of ``text``, atomically.

        Raises:
            KernelError: the text did not restore (naming the failing line); nothing changed.
        """
        ...

    async def list_chains(self, table: str) -> frozenset[str]:
        """The chains of ``table`` now (``iptables-save -t TABLE``; empty when there is no table).

        Raises:
            KernelError: the tables could not be read.
        """
        ...

    async def ensure_sysctl(self, name: str, value: str) -> None:
        """Set the sysctl ``name`` (``net.ipv4.conf.all.route_localnet``) to ``value`` unless it is.

        Raises:
            KernelError: it could not be read or set.
        """
        ...

    async def create_nfacct(self, name: str) -> None:
        """Create the nfacct object ``name`` unless it exists (``nfacct add NAME``).

        Raises:
            KernelError: it could not be created (a name over 31 characters, the tool missing).
        """
        ...

    async def clear_conntrack(self, filters: Sequence[ConntrackFilter]) -> int:
        """Delete the conntrack entries matching any of ``filters``; return how many went.

        Raises:
            KernelError: the deletion failed (the ``conntrack`` tool missing, for example).
        """
        ...


def failing_line(text: str, number: int | None) -> str:
    """Line ``number`` (1-based) of ``text``, or ``""`` when there is no such line."""
    if number is None or number < 1:
        return ""
    lines = text.splitlines()
    return lines[number - 1] if number <= len(lines) else ""


def quote_argument(word: str) -> str:
    """One argument as ``iptables-restore`` input writes it: double-quoted when it holds a space."""
    return f'"{word}"' if " " in word else word
