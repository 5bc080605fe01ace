"""Remove what the ipvs mode programmed (``kproxy run --cleanup``), as kube-proxy's ``--cleanup``.

Follows kube-proxy's ipvs ``cleanupLeftovers`` (pkg/proxy/ipvs/proxier.go): delete every
virtual server (``ipvs.Flush``), take the addresses off ``kube-ipvs0``, unlink the mode's jump
rules (:data:`~kproxy.modes.ipvs.JUMP_RULES`), flush then delete its chains
(:data:`~kproxy.modes.ipvs.CHAINS`), and destroy its ipsets. Each step is tried even when an
earlier one failed; a set or rule that is not there is not an error.
"""

from __future__ import annotations

from collections import defaultdict

from kproxy.errors import KernelError
from kproxy.kernel.ipvs import IpvsKernel
from kproxy.model.names import IPFamily
from kproxy.modes.iptables.cleanup import flush_and_delete
from kproxy.modes.ipvs.names import CHAINS, JUMP_RULES, SET_SPECS, set_name

__all__ = ["cleanup"]


async def cleanup(kernel: IpvsKernel) -> list[str]:
    """Remove the ipvs mode's state from ``kernel`` (see the module docstring).

    Returns:
        What failed, one line each (empty: everything that existed is gone).
    """
    errors: list[str] = []
    try:
        for server in kernel.virtual_servers():
            kernel.delete_virtual_server(server.spec.key)
        kernel.bind_addresses(())
    except KernelError as err:
        errors.append(str(err))
    for jump in JUMP_RULES:
        try:
            await kernel.netfilter.delete_rule(jump.table, jump.chain, jump.argv)
        except KernelError as err:
            errors.append(str(err))
    by_table: dict[str, list[str]] = defaultdict(list)
    for table, chain in CHAINS:
        by_table[table].append(chain)
    for table, chains in by_table.items():
        try:
            await flush_and_delete(kernel.netfilter, table, chains)
        except KernelError as err:
            errors.append(str(err))
    ipv6 = kernel.family is IPFamily.IPv6
    for spec in SET_SPECS:
        try:
            kernel.restore_ipsets(f"destroy {set_name(spec.name, ipv6)}\n")
        except KernelError as err:
            if "not exist" not in str(err) and "no such set" not in str(err).lower():
                errors.append(str(err))
    return errors
