"""The nftables mode's settings from a run configuration: one place for ``run``, ``render``,
``trace`` and ``verify``.

kube-proxy's nftables proxier reads the same node and rule flags as the iptables one
(``--cluster-cidr``, ``--masquerade-all``, ``--iptables-masquerade-bit``, which it reuses, and
``--nodeport-addresses``, whose default in this mode is ``primary``), plus ``--service-cidr``.
"""

from __future__ import annotations

from kproxy.config.run import RunConfig
from kproxy.model.names import IPFamily
from kproxy.modes.nftables.config import NftablesConfig

__all__ = ["nftables_config"]


def nftables_config(run: RunConfig, family: IPFamily | None = None) -> NftablesConfig:
    """The nftables settings of ``run``, rendering ``family`` (default: the primary family).

    ``--service-cidr`` is read from ``run.rules.service_cidrs`` when the run configuration has
    it (the DROP rule for unallocated ClusterIPs); without it none is written, as kube-proxy
    without ``--service-cidr``.

    Raises:
        ConfigError: never for a configuration :func:`~kproxy.config.build_run_config` built.
    """
    rules = run.rules
    service_cidrs: tuple[str, ...] = rules.service_cidrs
    return NftablesConfig.from_run(
        family=family or run.primary_family, node_ips=run.node.node_ips, cluster_cidr=rules.cluster_cidrs,
        masquerade_all=rules.masquerade_all, masquerade_bit=rules.masquerade_bit,
        nodeport_addresses=rules.nodeport_addresses, service_cidr=service_cidrs)
