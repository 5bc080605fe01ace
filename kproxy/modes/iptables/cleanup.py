"""Remove what the iptables mode programmed (``kproxy run --cleanup``), as kube-proxy's ``--cleanup``.

Follows kube-proxy's ``CleanupLeftovers`` (pkg/proxy/iptables/proxier.go): first unlink its
chains (delete each jump rule of :data:`~kproxy.modes.iptables.JUMP_RULES` from its built-in
chain, "not found" being fine); then, in one ``iptables-restore --noflush`` per table, flush and
delete its own nat chains (``KUBE-SERVICES``, ``KUBE-NODEPORTS``, ``KUBE-POSTROUTING``,
``KUBE-MARK-MASQ``, ``KUBE-PROXY-CANARY`` and every per-service chain) and filter chains
(``KUBE-SERVICES``, ``KUBE-EXTERNAL-SERVICES``, ``KUBE-FORWARD``, ``KUBE-NODEPORTS``,
``KUBE-PROXY-FIREWALL``, ``KUBE-PROXY-CANARY``) that exist; and the mangle canary. kubelet's
``KUBE-FIREWALL`` and its jumps stay: kube-proxy leaves them to kubelet. Other components'
rules are never touched.
"""

from __future__ import annotations

from collections.abc import Iterable

from kproxy.errors import KernelError
from kproxy.kernel.netfilter import NetfilterKernel
from kproxy.modes.iptables.names import (
    KUBE_EXTERNAL_SERVICES,
    KUBE_FORWARD,
    KUBE_MARK_MASQ,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_PROXY_FIREWALL,
    KUBE_SERVICES,
    is_service_chain_name,
)
from kproxy.modes.iptables.static import JUMP_RULES, JumpRule

__all__ = ["KUBE_PROXY_CANARY", "cleanup", "flush_and_delete"]

#: kube-proxy's ``kubeProxyCanaryChain``, in nat, filter and mangle.
KUBE_PROXY_CANARY = "KUBE-PROXY-CANARY"
_NAT = (KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ, KUBE_PROXY_CANARY)
_FILTER = (KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL,
           KUBE_PROXY_CANARY)


async def flush_and_delete(kernel: NetfilterKernel, table: str, chains: Iterable[str]) -> list[str]:
    """Flush and delete those of ``chains`` that exist in ``table``, in one restore; return them, sorted.

    Raises:
        KernelError: the tables could not be read or the restore was refused.
    """
    existing = await kernel.list_chains(table)
    doomed = sorted(c for c in set(chains) if c in existing)
    if doomed:
        lines = [f"*{table}", *(f":{c} - [0:0]" for c in doomed), *(f"-X {c}" for c in doomed), "COMMIT"]
        await kernel.restore("\n".join(lines) + "\n", noflush=True, counters=True)
    return doomed


async def cleanup(kernel: NetfilterKernel, jumps: Iterable[JumpRule] = JUMP_RULES) -> list[str]:
    """Remove the iptables mode's rules from ``kernel`` (see the module docstring).

    Every step is tried even when an earlier one failed, as kube-proxy does.

    Returns:
        What failed, one line each (empty: everything that existed is gone).
    """
    errors: list[str] = []
    for jump in jumps:
        try:
            await kernel.delete_rule(jump.table, jump.chain, jump.argv)
        except KernelError as err:
            errors.append(str(err))
    try:
        nat = await kernel.list_chains("nat")
        await flush_and_delete(kernel, "nat", [*_NAT, *(c for c in nat if is_service_chain_name(c))])
    except KernelError as err:
        errors.append(str(err))
    for table, chains in (("filter", _FILTER), ("mangle", (KUBE_PROXY_CANARY,))):
        try:
            await flush_and_delete(kernel, table, chains)
        except KernelError as err:
            errors.append(str(err))
    return errors
