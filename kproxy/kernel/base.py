"""What every applier shares: the applier protocol and the rules kube-proxy ensures outside the restore.

An *applier* puts an iptables-mode :class:`~kproxy.modes.iptables.RenderResult` into a kernel,
emulated (:class:`~kproxy.kernel.emulated.EmulatedKernel`) or real
(:class:`~kproxy.kernel.linux.LinuxKernel`). Both follow kube-proxy's ``syncProxyRules``
(pkg/proxy/iptables/proxier.go): on a *full* sync they first create the nfacct objects the rules
count into, then ensure :data:`ENSURED_JUMPS` (``EnsureChain`` then ``EnsureRule(Prepend, ...)``
for each, in order), and finally restore the text with ``iptables-restore --noflush --counters``.
A partial sync only restores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from kproxy.model.names import IPFamily
from kproxy.modes.iptables import JUMP_RULES, KUBELET_JUMP_RULES, JumpRule, RenderResult

__all__ = ["ENSURED_JUMPS", "IptablesApplier", "failing_line"]

#: What kube-proxy ensures on every full sync, in order: ``iptablesJumpChains`` then
#: ``iptablesKubeletJumpChains`` (kubelet's KUBE-FIREWALL jumps, kept by kube-proxy as well).
ENSURED_JUMPS: tuple[JumpRule, ...] = (*JUMP_RULES, *KUBELET_JUMP_RULES)


@runtime_checkable
class IptablesApplier(Protocol):
    """Where the iptables mode's rules go (see the module docstring).

    Attributes:
        family: the IP family of the tables written (``iptables`` or ``ip6tables``).
    """

    family: IPFamily

    async def apply(self, result: RenderResult, *, nfacct: Sequence[str] = ()) -> None:
        """Program ``result``: on a full result create ``nfacct`` objects and ensure the jump
        rules first; then restore ``result.text`` with ``--noflush``.

        Raises:
            KernelError: the kernel refused; the restore itself changed nothing.
        """
        ...

    async def existing_chains(self) -> frozenset[str]:
        """The chains of the nat table now (what kube-proxy reads with ``iptables-save -t nat``)."""
        ...


def failing_line(text: str, number: int | None) -> str:
    """Line ``number`` (1-based) of ``text``, or ``""`` when there is no such line."""
    if number is None or number < 1:
        return ""
    lines = text.splitlines()
    return lines[number - 1] if number <= len(lines) else ""
