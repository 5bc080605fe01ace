"""Run a kernel mode against a kernel until stopped (``kproxy run --proxy-mode iptables|nftables|ipvs``).

One mode per proxied IP family (kube-proxy runs one proxier per family), each with its own
kernel: emulated (``--kernel emulated``, the default, rootless: a fresh emulated node of the
node IPs) or the real kernel in the current network namespace (``--kernel linux``, root). A thin
shell: the sync engine does the rest, and :func:`~kproxy.daemon.engine.build_engine` adds
health and metrics as for every mode.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from emulation import ManualClock
from emulation.netfilter import Netns, Ruleset
from kproxy.config.defaults import DEFAULT_MIN_SYNC_PERIOD_S, DEFAULT_SYNC_PERIOD_S
from kproxy.config.run import RunConfig
from kproxy.daemon.debug import KernelDebug
from kproxy.daemon.engine import build_engine, run_until_stopped
from kproxy.errors import ConfigError, KernelError
from kproxy.kernel import (
    EmulatedIpvs,
    EmulatedNetfilter,
    IpvsNode,
    LinuxIpvs,
    LinuxNetfilter,
    LinuxNftables,
    emulated_nftables,
    trace_node,
)
from kproxy.model import IPFamily, NodeConfig
from kproxy.modes.iptables import IptablesConfig, IptablesMode
from kproxy.modes.iptables.cleanup import cleanup as cleanup_iptables
from kproxy.modes.ipvs import IpvsConfig
from kproxy.modes.ipvs.cleanup import cleanup as cleanup_ipvs
from kproxy.modes.ipvs.mode import IpvsMode
from kproxy.modes.nftables import NftablesConfig, NftablesMode
from kproxy.modes.nftables.settings import nftables_config
from kproxy.observability.server import ObservabilityOptions
from kproxy.sources.base import Source
from kproxy.sync.engine import Consumer

if TYPE_CHECKING:
    from kproxy.sources.kube import NodeWatch

__all__ = ["KERNELS", "KernelModes", "KernelRunOptions", "build_modes", "cleanup_kernel", "serve_kernel_mode",
           "serve_modes"]

#: The values of ``--kernel``.
KERNELS = ("emulated", "linux")

_log = structlog.get_logger("kproxy")


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelRunOptions:
    """How ``kproxy run`` runs a kernel mode.

    Attributes:
        mode: ``iptables``, ``nftables`` or ``ipvs``.
        iptables: the iptables settings (its ``family`` is replaced per proxied family); the
            ipvs mode masquerades with them too.
        ipvs: the ipvs settings (``mode == "ipvs"``).
        nftables: the nftables settings (``mode == "nftables"``; ``family`` replaced per family).
        kernel: ``emulated`` or ``linux``.
        min_sync_period_s, sync_period_s: the bounded-frequency runner's bounds, in seconds.

    Raises:
        ConfigError: an unknown ``kernel`` or ``mode``, or ``ipvs`` without its settings.
    """

    mode: str = "iptables"
    iptables: IptablesConfig
    ipvs: IpvsConfig | None = None
    nftables: NftablesConfig | None = None
    kernel: str = "emulated"
    min_sync_period_s: float = DEFAULT_MIN_SYNC_PERIOD_S
    sync_period_s: float = DEFAULT_SYNC_PERIOD_S

    @classmethod
    def from_run(cls, run: RunConfig) -> KernelRunOptions:
        """The kernel-mode view of a run configuration (``--proxy-mode iptables|nftables|ipvs``).

        Raises:
            ConfigError: the configuration's mode is not a kernel mode.
        """
        ipvs = IpvsConfig.from_run(run) if run.proxy_mode == "ipvs" else None
        nft = nftables_config(run) if run.proxy_mode == "nftables" else None
        return cls(mode=run.proxy_mode, iptables=IptablesConfig.from_run(run), ipvs=ipvs, nftables=nft,
                   kernel=str(run.rules.kernel), min_sync_period_s=run.sync.min_sync_period_s,
                   sync_period_s=run.sync.sync_period_s)

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ConfigError(f"--kernel: expected one of {', '.join(KERNELS)}, got {self.kernel!r}")
        if self.mode not in ("iptables", "nftables", "ipvs"):
            raise ConfigError(f"--proxy-mode: {self.mode!r} is not a kernel mode (iptables, nftables, ipvs)")
        if self.mode == "ipvs" and self.ipvs is None:
            raise ConfigError("the ipvs mode needs its settings (KernelRunOptions.ipvs)")
        if self.mode == "nftables" and self.nftables is None:
            raise ConfigError("the nftables mode needs its settings (KernelRunOptions.nftables)")


def _iptables_mode(options: KernelRunOptions, family: IPFamily) -> IptablesMode:
    config = options.iptables.for_family(family)
    if options.kernel == "linux":
        return IptablesMode(config, LinuxNetfilter(family), now=time.monotonic)
    version = 6 if family is IPFamily.IPv6 else 4
    netns = Netns(trace_node(config.node_ips), ManualClock(), ruleset=Ruleset(version))
    return IptablesMode(config, EmulatedNetfilter(netns, family), now=time.monotonic)


def _ipvs_mode(options: KernelRunOptions, family: IPFamily) -> IpvsMode:
    assert options.ipvs is not None
    config = options.ipvs.for_family(family)
    if options.kernel == "linux":
        return IpvsMode(config, LinuxIpvs(family), now=time.monotonic)
    node = IpvsNode(trace_node(config.node_ips), ManualClock(), version=6 if family is IPFamily.IPv6 else 4)
    return IpvsMode(config, EmulatedIpvs(node), now=time.monotonic)


def _nftables_mode(options: KernelRunOptions, family: IPFamily) -> NftablesMode:
    """kube-proxy's nftables proxier for ``family``: ``nft -f`` here (linux) or a fresh emulated
    namespace of the node IPs (emulated), as ``NewProxier`` makes one table per family."""
    assert options.nftables is not None
    config = options.nftables.for_family(family)
    if options.kernel == "linux":
        return NftablesMode(config, LinuxNftables(family), now=time.monotonic)
    return NftablesMode(config, emulated_nftables(config.node_ips, family), now=time.monotonic)


_TOOLS = {"iptables": "iptables-restore", "nftables": "nft -f", "ipvs": "ipvsadm, ipset and iptables-restore"}
KernelModes = list[IptablesMode] | list[IpvsMode] | list[NftablesMode]


def build_modes(node: NodeConfig, options: KernelRunOptions) -> KernelModes:
    """One mode per family of ``node.ip_families``, each with a fresh kernel.

    Raises:
        ConfigError: ``linux`` without root.
    """
    if options.kernel == "linux" and os.geteuid() != 0:
        raise ConfigError(f"--kernel linux needs root (it runs {_TOOLS[options.mode]}); "
                          "use --kernel emulated")
    if options.mode == "ipvs":
        return [_ipvs_mode(options, family) for family in node.ip_families]
    if options.mode == "nftables":
        return [_nftables_mode(options, family) for family in node.ip_families]
    return [_iptables_mode(options, family) for family in node.ip_families]


async def serve_kernel_mode(source: Source, node: NodeConfig, options: KernelRunOptions, stop: asyncio.Event,
                            observability: ObservabilityOptions | None = None, *,
                            node_watch: NodeWatch | None = None,
                            follow_zone: bool = True) -> KernelModes:
    """Keep the chosen kernel in sync with ``source`` until ``stop`` is set; return the modes.

    With ``observability``, ``/healthz``, ``/livez``, ``/metrics`` (sync metrics of the modes'
    engine) and health check node ports are served beside it, as in userspace mode; with
    ``node_watch``, this node's Node is followed.

    Raises:
        ConfigError: see :func:`build_modes`; an observability address is malformed or unusable.
    """
    modes = build_modes(node, options)
    await serve_modes(modes, source, node, options, stop, observability, node_watch=node_watch,
                      follow_zone=follow_zone)
    return modes


async def serve_modes(modes: KernelModes, source: Source, node: NodeConfig,
                      options: KernelRunOptions, stop: asyncio.Event,
                      observability: ObservabilityOptions | None = None, *,
                      node_watch: NodeWatch | None = None, follow_zone: bool = True,
                      extra_consumers: Sequence[Consumer] = ()) -> None:
    """Keep ``modes`` (from :func:`build_modes`) in sync with ``source`` until ``stop`` is set.

    ``extra_consumers`` (the HTTP plane's listener) get every Snapshot after the modes.

    Raises:
        ConfigError: an observability address is malformed or unusable.
    """
    consumers: list[Consumer] = [*modes, *extra_consumers]
    engine, obs = build_engine(source, node, consumers, min_sync_period_s=options.min_sync_period_s,
                               sync_period_s=options.sync_period_s, observability=observability)
    if obs is not None:
        if options.kernel == "emulated":
            obs.serve_debug(KernelDebug(modes, options.iptables.node_ips))
        else:
            obs.serve_debug(None, why_not="--kernel linux")
    _log.info("starting", mode=options.mode, kernel=options.kernel, node=node.hostname,
              families=[str(f) for f in node.ip_families])
    await run_until_stopped(engine, obs, stop, node_watch=node_watch, follow_zone=follow_zone)


async def _cleanup_nftables(kernel: LinuxNftables) -> list[str]:
    """Delete the family's ``kube-proxy`` nftables table; nothing to do without ``nft`` (logged)."""
    if shutil.which("nft") is None:
        _log.info("nft not installed; nothing of the nftables mode to clean", family=str(kernel.family))
        return []
    try:
        await kernel.delete_table()
    except KernelError as err:
        return [f"deleting table {kernel.family} kube-proxy: {err}"]
    return []


async def cleanup_kernel(families: tuple[IPFamily, ...]) -> list[str]:
    """``kproxy run --cleanup``: remove what the iptables, nftables and ipvs modes program from this
    network namespace (the nftables mode's ``kube-proxy`` tables too), for each of ``families``,
    as kube-proxy's ``--cleanup`` removes every mode's leftovers whatever its own mode
    (``cmd/kube-proxy/app/server.go`` ``cleanupAndExit``).

    IPVS is cleaned only where ``ipvsadm`` answers (kube-proxy checks for the ``ip_vs`` module
    first and skips it otherwise).

    Returns:
        What failed, one line each (empty: done).

    Raises:
        ConfigError: not root.
    """
    if os.geteuid() != 0:
        raise ConfigError("--cleanup needs root: it removes rules from this network namespace's kernel")
    errors: list[str] = []
    for family in families:
        errors += await cleanup_iptables(LinuxNetfilter(family))
        errors += await _cleanup_nftables(LinuxNftables(family))
        ipvs = LinuxIpvs(family)
        try:
            ipvs.virtual_servers()
        except KernelError as err:
            _log.info("IPVS not available here; nothing of the ipvs mode to clean", family=str(family),
                      reason=str(err).splitlines()[0])
            continue
        errors += await cleanup_ipvs(ipvs)
    return errors
