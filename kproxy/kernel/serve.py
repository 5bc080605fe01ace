"""Run the iptables mode against a kernel until stopped (``kproxy run --proxy-mode iptables``).

One :class:`~kproxy.modes.iptables.mode.IptablesMode` per proxied IP family (kube-proxy runs one
proxier per family), each with its own applier: an :class:`EmulatedKernel` over a fresh
emulated namespace (``--kernel emulated``, the default, rootless) or a :class:`LinuxKernel` in
the current network namespace (``--kernel linux``, root). A thin shell: the sync engine does
the rest.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from emulation import ManualClock
from emulation.netfilter import Netns, Ruleset
from kproxy.errors import ConfigError
from kproxy.kernel.base import IptablesApplier
from kproxy.kernel.emulated import EmulatedKernel
from kproxy.kernel.linux import LinuxKernel
from kproxy.kernel.trace import trace_node
from kproxy.model import IPFamily, NodeConfig
from kproxy.modes.iptables import IptablesConfig
from kproxy.modes.iptables.mode import IptablesMode
from kproxy.sources.base import Source

if TYPE_CHECKING:
    from kproxy.observability.server import ObservabilityOptions
    from kproxy.sources.kube import NodeWatch

__all__ = ["KERNELS", "IptablesRunOptions", "build_modes", "serve_iptables"]

#: The values of ``--kernel``.
KERNELS = ("emulated", "linux")

_log = structlog.get_logger("kproxy")


@dataclass(frozen=True, slots=True, kw_only=True)
class IptablesRunOptions:
    """How ``kproxy run --proxy-mode iptables`` runs.

    Attributes:
        config: the iptables settings (its ``family`` is replaced per proxied family).
        kernel: ``emulated`` or ``linux``.
        min_sync_period_s, sync_period_s: the bounded-frequency runner's bounds, in seconds.
    """

    config: IptablesConfig
    kernel: str = "emulated"
    min_sync_period_s: float = 1.0
    sync_period_s: float = 30.0

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ConfigError(f"--kernel: expected one of {', '.join(KERNELS)}, got {self.kernel!r}")


def _applier(kind: str, family: IPFamily, config: IptablesConfig) -> IptablesApplier:
    if kind == "linux":
        return LinuxKernel(family)
    version = 6 if family is IPFamily.IPv6 else 4
    node = trace_node(config.node_ips)
    return EmulatedKernel(Netns(node, ManualClock(), ruleset=Ruleset(version)), family)


def build_modes(node: NodeConfig, options: IptablesRunOptions) -> list[IptablesMode]:
    """One mode per family of ``node.ip_families``, each with a fresh applier.

    Raises:
        ConfigError: ``linux`` without root.
    """
    if options.kernel == "linux" and os.geteuid() != 0:
        raise ConfigError("--kernel linux needs root (it runs iptables-restore); use --kernel emulated")
    modes = []
    for family in node.ip_families:
        config = options.config.for_family(family)
        modes.append(IptablesMode(config, _applier(options.kernel, family, config), now=time.monotonic))
    return modes


async def serve_iptables(source: Source, node: NodeConfig, options: IptablesRunOptions,
                         stop: asyncio.Event,
                         observability: ObservabilityOptions | None = None, *,
                         node_watch: NodeWatch | None = None, follow_zone: bool = True) -> list[IptablesMode]:
    """Keep the chosen kernel in sync with ``source`` until ``stop`` is set; return the modes.

    With ``observability``, ``/healthz``, ``/livez``, ``/metrics`` (sync metrics of the modes'
    engine) and health check node ports are served beside it, as in userspace mode (see
    :func:`kproxy.daemon.build_engine`); with ``node_watch``, this node's Node is followed.

    Raises:
        ConfigError: see :func:`build_modes`; an observability address is malformed or unusable.
    """
    from kproxy.daemon import build_engine, run_until_stopped

    modes = build_modes(node, options)
    engine, obs = build_engine(source, node, modes, min_sync_period_s=options.min_sync_period_s,
                               sync_period_s=options.sync_period_s, observability=observability)
    _log.info("starting", mode="iptables", kernel=options.kernel, node=node.hostname,
              families=[str(f) for f in node.ip_families])
    await run_until_stopped(engine, obs, stop, node_watch=node_watch, follow_zone=follow_zone)
    _log.info("stopped")
    return modes
