"""The ``kproxy`` command: argument parsing only; the work happens in :mod:`kproxy.daemon`.

Flags follow kube-proxy's names where one exists (``--proxy-mode``, ``--hostname-override``,
``--min-sync-period``, ``--sync-period``, ``--bind-address``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import structlog

from kproxy.cli.durations import parse_duration
from kproxy.errors import ConfigError, KproxyError
from kproxy.model import IPFamily, NodeConfig
from kproxy.observability import configure_logging

__all__ = ["build_parser", "main"]

_MODES = ("userspace", "iptables", "nftables", "ipvs", "ebpf")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every ``kproxy`` subcommand."""
    parser = argparse.ArgumentParser(
        prog="kproxy",
        description="Kubernetes Service proxying, as kube-proxy does it, in Python.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="proxy Services for real (userspace mode)",
                         description="Watch Services and EndpointSlices and proxy their traffic.")
    src = run.add_argument_group("source")
    src.add_argument("--manifests", nargs="+", metavar="PATH", default=None,
                     help="YAML or JSON files or folders with Services and EndpointSlices; "
                          "reloaded when they change (exclusive with --kubeconfig/--master)")
    from kproxy.config.flags import add_kube_flags
    add_kube_flags(run, src)
    run.add_argument("--proxy-mode", default="userspace", choices=_MODES,
                     help="the proxy mode: userspace, or iptables (see --kernel); default userspace")
    node = run.add_argument_group("node")
    node.add_argument("--hostname-override", default=None, metavar="NAME",
                      help="this node's name; endpoints with this nodeName are local "
                           "(default: the host name, lower case, as kube-proxy)")
    node.add_argument("--node-zone", default=None, metavar="ZONE",
                      help="this node's topology.kubernetes.io/zone label, for topology hints")
    node.add_argument("--ip-families", default="IPv4,IPv6", metavar="LIST",
                      help="families to proxy, primary first (default IPv4,IPv6)")
    node.add_argument("--service-proxy-name", default=None, metavar="NAME",
                      help="serve Services labelled service.kubernetes.io/service-proxy-name=NAME "
                           "(default: none, as kube-proxy)")
    node.add_argument("--node-ip", action="append", default=[], metavar="IP",
                      help="iptables mode: this node's IP (repeatable); NodePorts and masquerade use it")
    ipt = run.add_argument_group("iptables mode")
    ipt.add_argument("--cluster-cidr", default=None, metavar="CIDR[,CIDR]",
                     help="pod CIDRs: traffic from outside them to a ClusterIP is masqueraded")
    ipt.add_argument("--masquerade-all", action="store_true",
                     help="masquerade all traffic sent to ClusterIPs")
    ipt.add_argument("--nodeport-addresses", default=None, metavar="CIDR[,CIDR]|primary",
                     help="addresses NodePorts accept on (default: every local address)")
    ipt.add_argument("--iptables-masquerade-bit", type=int, default=14, metavar="BIT",
                     help="the fwmark bit that marks packets for masquerade (default 14)")
    us = run.add_argument_group("userspace data plane")
    us.add_argument("--bind-address", default=None, metavar="ADDR",
                    help="listen on this one address, one port per service port (default: one "
                         "loopback address per Service, on the Service's own ports)")
    us.add_argument("--loopback-block", default="127.0.0.0/8", metavar="CIDR",
                    help="block the per-Service loopback addresses come from (default 127.0.0.0/8)")
    us.add_argument("--address-map", default=None, metavar="FILE",
                    help="write the address table as JSON to FILE at every change")
    us.add_argument("--udp-timeout", default="30s", metavar="D",
                    help="idle timeout of a UDP session (default 30s)")
    us.add_argument("--drain-timeout", default="10s", metavar="D",
                    help="on SIGINT/SIGTERM, how long open connections may finish (default 10s)")
    sync = run.add_argument_group("sync")
    sync.add_argument("--min-sync-period", default=None, metavar="D",
                      help="minimum time between syncs (default 1s, or --config's)")
    sync.add_argument("--sync-period", default=None, metavar="D",
                      help="maximum time between syncs (default 30s, or --config's)")
    run.add_argument("--log-format", default="console", choices=("console", "json"))
    run.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    run.add_argument("--kernel", default="emulated", choices=("emulated", "linux"),
                     help="iptables mode: program an emulated node (default) or, as root, this netns")
    from kproxy.cli import render, trace, verify
    render.add_parser(sub)
    trace.add_parser(sub)
    verify.add_parser(sub)
    return parser


def _families(text: str) -> tuple[IPFamily, ...]:
    out = []
    for item in text.split(","):
        name = item.strip()
        matches = [f for f in IPFamily if f.value.lower() == name.lower()]
        if not matches:
            raise ConfigError(f"--ip-families: unknown family {name!r}; expected IPv4 and/or IPv6")
        if matches[0] in out:
            raise ConfigError(f"--ip-families: {name} is listed twice")
        out.append(matches[0])
    return tuple(out)


def _run(args: argparse.Namespace) -> int:
    from kproxy.config.flags import build_source, merge_config, node_facts, observability_options
    from kproxy.daemon import UserspaceOptions, serve
    from kproxy.sources.kube import default_hostname

    merge_config(args)

    if args.proxy_mode not in ("userspace", "iptables"):
        raise ConfigError(
            f"--proxy-mode {args.proxy_mode}: `kproxy run` runs the userspace and iptables modes "
            "so far; the other modes are rendered and traced, not run")
    if args.proxy_mode == "userspace":
        from kproxy.userspace import check_bind_address, check_loopback_block

        if args.bind_address is not None:
            _flag_error("--bind-address", check_bind_address, args.bind_address)
        else:
            _flag_error("--loopback-block", check_loopback_block, args.loopback_block)
    min_sync = parse_duration(args.min_sync_period, flag="--min-sync-period")
    sync_period = parse_duration(args.sync_period, flag="--sync-period")
    if sync_period <= 0 or min_sync > sync_period:
        raise ConfigError(f"--sync-period ({args.sync_period}) must be > 0 and >= "
                          f"--min-sync-period ({args.min_sync_period})")
    udp_timeout = parse_duration(args.udp_timeout, flag="--udp-timeout")
    if udp_timeout <= 0:
        raise ConfigError(f"--udp-timeout: a UDP session needs an idle timeout > 0, got {args.udp_timeout!r}")
    if args.address_map is not None:
        folder = os.path.dirname(os.path.abspath(args.address_map))
        if not os.path.isdir(folder):
            raise ConfigError(f"--address-map: folder {folder!r} does not exist")
    for path in args.manifests or ():
        if not os.path.exists(path):
            raise ConfigError(f"--manifests: {path!r} does not exist; expected a file or a folder")
    options = UserspaceOptions(
        bind_address=args.bind_address,
        loopback_block=args.loopback_block,
        address_map_path=args.address_map,
        udp_idle_timeout_s=udp_timeout,
        min_sync_period_s=min_sync,
        sync_period_s=sync_period,
        drain_timeout_s=parse_duration(args.drain_timeout, flag="--drain-timeout"),
    )
    source = build_source(args)
    hostname = default_hostname(args.hostname_override, gethostname=socket.gethostname)
    zone, eligible = node_facts(args, hostname)
    node = NodeConfig(hostname=hostname, zone=zone,
                      ip_families=_families(args.ip_families),
                      service_proxy_name=args.service_proxy_name)

    async def main_async() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if args.proxy_mode == "iptables":
            from kproxy.cli.render import iptables_run_options
            from kproxy.kernel.serve import serve_iptables
            await serve_iptables(source, node, iptables_run_options(args, options), stop)
            return
        await serve(source, node, options, stop, observability_options(args, eligible=eligible))

    _run_loop(main_async)
    return 0


def _flag_error(flag: str, check: Callable[[str], None], value: str) -> None:
    """Run ``check(value)``; a ConfigError it raises is re-raised naming ``flag``."""
    try:
        check(value)
    except ConfigError as err:
        raise ConfigError(f"{flag}: {err}") from None


def _run_loop(factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``factory()`` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(factory())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(factory())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kproxy`` console script; returns the exit status.

    Exit status: 0 on success (and after a clean SIGINT/SIGTERM), 2 for a usage or
    configuration error (the message names the flag or file), 1 for any other kproxy error.
    """
    args = build_parser().parse_args(argv)
    configure_logging(getattr(args, "log_format", "console"), level=getattr(args, "log_level", "info"))
    try:
        if args.command == "run":
            return _run(args)
        if getattr(args, "handler", None) is not None:
            return int(args.handler(args))
    except ConfigError as err:
        print(f"kproxy: {err}", file=sys.stderr)
        return 2
    except KproxyError as err:
        structlog.get_logger("kproxy").error("fatal", error=str(err))
        if getattr(args, "log_format", "console") != "json":
            print(f"kproxy: {err}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
