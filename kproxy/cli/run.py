"""``kproxy run``: its flags, and the hand-over to :func:`kproxy.daemon.lifecycle.run_daemon`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from kproxy.cli.flags import add_config_flag, add_manifests_flag, add_node_flags, add_rule_flags, given_flags
from kproxy.config import Command, RunConfig, build_run_config
from kproxy.config.defaults import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_LOOPBACK_BLOCK,
    DEFAULT_MIN_SYNC_PERIOD_S,
    DEFAULT_RUN_MODE,
    DEFAULT_SYNC_PERIOD_S,
    DEFAULT_UDP_TIMEOUT_S,
)
from kproxy.modes import MODES, run_modes

__all__ = ["add_parser", "run"]

_HIDE = argparse.SUPPRESS


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``run`` on the ``kproxy`` subparsers."""
    modes = run_modes()
    parser = sub.add_parser("run", help=f"proxy Services for real ({', '.join(modes)} mode)",
                            description="Watch Services and EndpointSlices and proxy their traffic. SIGHUP "
                                        "reloads --config and the manifests; SIGTERM/SIGINT drain and "
                                        "stop (a second SIGINT cuts the drain short).")
    src = parser.add_argument_group("source")
    add_manifests_flag(src, required=False, help_extra="; files and folders are reloaded when they change "
                                                       "(exclusive with --kubeconfig/--master)")
    src.add_argument("--kubeconfig", default=_HIDE, metavar="FILE",
                     help="follow a cluster: the kubeconfig file (exclusive with --manifests; default: "
                          "--config's clientConnection.kubeconfig unless --manifests is given)")
    src.add_argument("--master", default=_HIDE, metavar="URL",
                     help="the API server URL (overrides the kubeconfig's server)")
    src.add_argument("--service-proxy-name", default=_HIDE, metavar="NAME",
                     help="serve Services labelled service.kubernetes.io/service-proxy-name=NAME "
                          "(default: none, as kube-proxy)")
    add_config_flag(parser)
    summaries = "; ".join(f"{name}: {MODES[name].summary}" for name in modes)
    add_rule_flags(parser, modes=modes, default_mode=DEFAULT_RUN_MODE,
                   mode_help=f"the proxy mode ({summaries})")
    add_node_flags(parser, node_ip_help="; iptables and ipvs modes: NodePorts and masquerade use it")
    parser.add_argument("--kernel", default=_HIDE, choices=("emulated", "linux"),
                        help="iptables, nftables and ipvs modes: program an emulated node (default) or, "
                             "as root, this netns")
    parser.add_argument("--cleanup", action="store_true", default=False,
                        help="as kube-proxy's --cleanup: remove the iptables, nftables and ipvs modes' "
                             "rules, tables, virtual servers, ipsets and addresses from this network "
                             "namespace (IPv4 and IPv6; root), then exit; nothing else is needed or started")
    obs = parser.add_argument_group("health and metrics")
    obs.add_argument("--healthz-bind-address", default=_HIDE, metavar="IP:PORT",
                     help="/healthz and /livez (default 127.0.0.1:10256; kube-proxy's is 0.0.0.0:10256; "
                          "'' disables)")
    obs.add_argument("--metrics-bind-address", default=_HIDE, metavar="IP:PORT",
                     help="/metrics (default 127.0.0.1:10249; '' disables)")
    obs.add_argument("--healthcheck-bind-addresses", default=_HIDE, metavar="IP[,IP]",
                     help="the addresses health check node ports listen on (default 127.0.0.1; "
                          "kube-proxy uses every node address within --nodeport-addresses: pass 0.0.0.0 "
                          "or the node IPs)")
    us = parser.add_argument_group("userspace data plane")
    us.add_argument("--bind-address", default=_HIDE, metavar="ADDR",
                    help="listen on this one address, one port per service port (default: one "
                         "loopback address per Service, on the Service's own ports)")
    us.add_argument("--loopback-block", default=_HIDE, metavar="CIDR",
                    help=f"block the per-Service loopback addresses come from (default "
                         f"{DEFAULT_LOOPBACK_BLOCK})")
    us.add_argument("--address-map", default=_HIDE, metavar="FILE",
                    help="write the address table as JSON to FILE at every change")
    us.add_argument("--udp-timeout", default=_HIDE, metavar="D",
                    help=f"idle timeout of a UDP session (default {DEFAULT_UDP_TIMEOUT_S:g}s)")
    us.add_argument("--drain-timeout", default=_HIDE, metavar="D",
                    help=f"on SIGINT/SIGTERM, how long open connections may finish (default "
                         f"{DEFAULT_DRAIN_TIMEOUT_S:g}s; a second SIGINT cuts it short; the kernel modes "
                         "hold no connections)")
    for flag, what in (("--max-connections", "relayed TCP connections open at once, all service ports"),
                       ("--max-connections-per-service", "relayed TCP connections open at once on one "
                                                         "service port"),
                       ("--max-udp-sessions", "UDP sessions open at once, all service ports"),
                       ("--max-udp-sessions-per-service", "UDP sessions open at once on one service port")):
        us.add_argument(flag, default=_HIDE, metavar="N",
                        help=f"{what}; past it a new TCP connection is reset at once and a new UDP flow "
                             "evicts the least recently active session (default: sized from the "
                             "open-files limit)")
    l7 = parser.add_argument_group("HTTP (layer 7) plane")
    l7.add_argument("--ingress-bind-address", default=_HIDE, metavar="IP:PORT",
                    help="serve the Ingresses of --ingress-class over HTTP/1.1 here, as ingress-nginx "
                         "(e.g. 127.0.0.1:8080; default: no listener)")
    l7.add_argument("--ingress-class", default=_HIDE, metavar="NAME",
                    help="the Ingress class served: spec.ingressClassName or the kubernetes.io/ingress.class "
                         "annotation (default nginx; Ingresses with no class are served too)")
    sync = parser.add_argument_group("sync")
    sync.add_argument("--min-sync-period", default=_HIDE, metavar="D",
                      help=f"minimum time between syncs, a Go duration such as 1s or 250ms (default "
                           f"{DEFAULT_MIN_SYNC_PERIOD_S:g}s, or --config's)")
    sync.add_argument("--sync-period", default=_HIDE, metavar="D",
                      help=f"maximum time between syncs (default {DEFAULT_SYNC_PERIOD_S:g}s, or --config's)")
    log = parser.add_argument_group("logging")
    log.add_argument("--log-format", default=_HIDE, choices=("console", "json"),
                     help="console: one readable line per event on stderr (default); json: one JSON object "
                          "per line, for log collectors")
    log.add_argument("--log-level", default=_HIDE, choices=("debug", "info", "warning", "error"),
                     help="the least severe events logged (default info; debug adds tracebacks and every "
                          "sync)")
    parser.set_defaults(handler=run, subparser=parser)


def config_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> RunConfig:
    """``run``'s configuration from its parsed flags, ``--config`` and the environment.

    Raises:
        ConfigError: a bad value, naming the flag or the file and field.
    """
    return build_run_config(given_flags(args, parser), command=Command.RUN, modes=run_modes(),
                            default_mode=DEFAULT_RUN_MODE)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``kproxy run``: serve until SIGTERM/SIGINT (reloading on SIGHUP); exit status 0.

    Raises:
        ConfigError: a bad flag or file value, or a start-up problem (see
            :func:`kproxy.daemon.lifecycle.run_daemon`).
    """
    from kproxy.daemon.lifecycle import run_daemon

    if args.cleanup:
        return _cleanup(args)
    first = config_of(args, parser)
    _run_loop(lambda: run_daemon(lambda: config_of(args, parser), first))
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    """``run --cleanup``: exit 0 when everything that existed is gone, 1 when something failed.

    Raises:
        ConfigError: ``--kernel emulated`` (an emulated kernel lives only inside a running kproxy),
            or not root.
    """
    from kproxy.daemon.kernel import cleanup_kernel
    from kproxy.errors import ConfigError
    from kproxy.model import IPFamily

    if getattr(args, "kernel", "linux") == "emulated":
        raise ConfigError("--cleanup acts on this network namespace's kernel; an emulated kernel lives only "
                          "inside a running kproxy and goes with it (drop --kernel emulated)")
    errors = asyncio.run(cleanup_kernel((IPFamily.IPv4, IPFamily.IPv6)))
    for line in errors:
        print(f"kproxy: cleanup: {line}", file=sys.stderr)
    return 1 if errors else 0


def _run_loop(factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``factory()`` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(factory())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(factory())
