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

from kproxy.config.durations import parse_duration
from kproxy.errors import ConfigError, KproxyError
from kproxy.model import IPFamily, NodeConfig
from kproxy.observability import configure_logging

__all__ = ["build_parser", "main"]

#: The modes ``kproxy run`` runs.
_MODES = ("userspace", "iptables", "ipvs")
#: Userspace-only flags: (flag, attribute); given in iptables mode they are ignored with a warning.
_USERSPACE_ONLY = (("--bind-address", "bind_address"), ("--loopback-block", "loopback_block"),
                   ("--address-map", "address_map"), ("--udp-timeout", "udp_timeout"),
                   ("--drain-timeout", "drain_timeout"))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every ``kproxy`` subcommand."""
    parser = argparse.ArgumentParser(
        prog="kproxy",
        description="Kubernetes Service proxying, as kube-proxy does it, in Python.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="proxy Services for real (userspace or iptables mode)",
                         description="Watch Services and EndpointSlices and proxy their traffic.")
    src = run.add_argument_group("source")
    src.add_argument("--manifests", nargs="+", metavar="PATH", default=None,
                     help="YAML or JSON files or folders with Services and EndpointSlices; "
                          "reloaded when they change (exclusive with --kubeconfig/--master)")
    from kproxy.config.flags import add_kube_flags
    add_kube_flags(run, src)
    run.add_argument("--proxy-mode", default=None, choices=_MODES,
                     help="the proxy mode: userspace, or iptables or ipvs (see --kernel); default "
                          "--config's mode, else userspace")
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
    ipt.add_argument("--masquerade-all", action="store_true", default=None,
                     help="masquerade all traffic sent to ClusterIPs (default: --config's, else off)")
    ipt.add_argument("--nodeport-addresses", default=None, metavar="CIDR[,CIDR]|primary",
                     help="addresses NodePorts accept on: CIDRs (IP/32 for one address) or primary "
                          "(default: every local address)")
    ipt.add_argument("--iptables-masquerade-bit", type=int, default=None, metavar="BIT",
                     help="the fwmark bit that marks packets for masquerade (default --config's, else 14)")
    ipt.add_argument("--iptables-localhost-nodeports", type=_boolean, default=None, metavar="BOOL",
                     help="accept NodePort connections to 127.0.0.1 (IPv4; default --config's, else true)")
    ipt.add_argument("--ipvs-scheduler", default=None, metavar="NAME",
                     help="ipvs mode: the IPVS scheduler (rr, wrr, lc, wlc, sed, nq, fo, ovf, sh, dh, mh; "
                          "default --config's ipvs.scheduler, else rr)")
    us = run.add_argument_group("userspace data plane")
    us.add_argument("--bind-address", default=None, metavar="ADDR",
                    help="listen on this one address, one port per service port (default: one "
                         "loopback address per Service, on the Service's own ports)")
    us.add_argument("--loopback-block", default=None, metavar="CIDR",
                    help="block the per-Service loopback addresses come from (default 127.0.0.0/8)")
    us.add_argument("--address-map", default=None, metavar="FILE",
                    help="write the address table as JSON to FILE at every change")
    us.add_argument("--udp-timeout", default=None, metavar="D",
                    help="idle timeout of a UDP session (default 30s)")
    us.add_argument("--drain-timeout", default=None, metavar="D",
                    help="on SIGINT/SIGTERM, how long open connections may finish (default 10s; the "
                         "iptables mode holds no connections)")
    sync = run.add_argument_group("sync")
    sync.add_argument("--min-sync-period", default=None, metavar="D",
                      help="minimum time between syncs (default 1s, or --config's)")
    sync.add_argument("--sync-period", default=None, metavar="D",
                      help="maximum time between syncs (default 30s, or --config's)")
    run.add_argument("--log-format", default="console", choices=("console", "json"))
    run.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    run.add_argument("--kernel", default=None, choices=("emulated", "linux"),
                     help="iptables mode: program an emulated node (default) or, as root, this netns")
    from kproxy.cli import render, trace, verify
    render.add_parser(sub)
    trace.add_parser(sub)
    verify.add_parser(sub)
    return parser


def _boolean(text: str) -> bool:
    """``true``/``false`` (and 1/0, yes/no), as Go's flag package reads a bool flag's value."""
    value = text.strip().lower()
    if value in ("true", "1", "t", "yes"):
        return True
    if value in ("false", "0", "f", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


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


#: iptables-only flags: (flag, attribute); given in userspace mode they are ignored with a warning.
_IPTABLES_ONLY = (("--node-ip", "node_ip"), ("--cluster-cidr", "cluster_cidr"),
                  ("--masquerade-all", "masquerade_all"), ("--nodeport-addresses", "nodeport_addresses"),
                  ("--iptables-masquerade-bit", "iptables_masquerade_bit"),
                  ("--iptables-localhost-nodeports", "iptables_localhost_nodeports"), ("--kernel", "kernel"),
                  ("--ipvs-scheduler", "ipvs_scheduler"))


def _given(args: argparse.Namespace, flags: Sequence[tuple[str, str]]) -> list[str]:
    """The flags of ``flags`` given on the command line (their parser default is None or [])."""
    return [flag for flag, attr in flags if getattr(args, attr, None) not in (None, [])]


def _warn_ignored(mode: str, given: Sequence[str]) -> None:
    """Log each flag given that ``mode`` does not use (never silently ignored)."""
    for flag in given:
        structlog.get_logger("kproxy").warning("flag ignored: the proxy mode does not use it", flag=flag,
                                               proxy_mode=mode)


def _run(args: argparse.Namespace) -> int:
    from kproxy.config.flags import merge_config
    from kproxy.config.kubeproxy import nodeport_addresses_flag
    from kproxy.daemon import UserspaceOptions, serve
    from kproxy.daemon.kernel import serve_kernel_mode
    from kproxy.daemon.setup import build_source, node_facts, node_watch, observability_options
    from kproxy.sources.kube import default_hostname

    userspace_given = _given(args, _USERSPACE_ONLY)
    iptables_given = _given(args, _IPTABLES_ONLY)
    merge_config(args)  # also settles --proxy-mode (the flag, else --config's mode, else userspace)
    if args.nodeport_addresses is not None:  # kube-proxy validates it whatever the mode
        nodeport_addresses_flag(args.nodeport_addresses)
    _warn_ignored(args.proxy_mode, iptables_given if args.proxy_mode == "userspace" else userspace_given)
    if args.loopback_block is None:
        args.loopback_block = "127.0.0.0/8"
    if args.udp_timeout is None:
        args.udp_timeout = "30s"
    if args.drain_timeout is None:
        args.drain_timeout = "10s"
    if args.kernel is None:
        args.kernel = "emulated"

    if args.proxy_mode == "userspace":
        from kproxy.modes.userspace import check_bind_address, check_loopback_block

        if args.bind_address is not None:
            _flag_error("--bind-address", check_bind_address, args.bind_address)
        else:
            _flag_error("--loopback-block", check_loopback_block, args.loopback_block)
    min_sync = parse_duration(args.min_sync_period, flag=args.min_sync_period_from)
    sync_period = parse_duration(args.sync_period, flag=args.sync_period_from)
    if sync_period <= 0 or min_sync > sync_period:
        raise ConfigError(f"{args.sync_period_from} ({args.sync_period}) must be > 0 and >= "
                          f"{args.min_sync_period_from} ({args.min_sync_period})")
    udp_timeout = parse_duration(args.udp_timeout, flag="--udp-timeout")
    if udp_timeout <= 0:
        raise ConfigError(f"--udp-timeout: a UDP session needs an idle timeout > 0, got {args.udp_timeout!r}")
    if args.address_map is not None and args.proxy_mode == "userspace":
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
    if args.proxy_mode == "iptables" and args.ipvs_scheduler is not None:
        _warn_ignored("iptables", ["--ipvs-scheduler"])
    kernel_options = None
    if args.proxy_mode in ("iptables", "ipvs"):
        kernel_options = _kernel_options(args, options)
    source = build_source(args)  # checks --kubeconfig/--master before anything listens
    hostname = default_hostname(args.hostname_override, gethostname=socket.gethostname)
    zone, eligible = node_facts(args, hostname)
    node = NodeConfig(hostname=hostname, zone=zone,
                      ip_families=_families(args.ip_families),
                      service_proxy_name=args.service_proxy_name)
    observability = observability_options(args, eligible=eligible)
    watch = node_watch(args, hostname)
    follow_zone = args.node_zone is None

    async def main_async() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if kernel_options is not None:
            await serve_kernel_mode(source, node, kernel_options, stop, observability, node_watch=watch,
                                    follow_zone=follow_zone)
            return
        await serve(source, node, options, stop, observability, node_watch=watch, follow_zone=follow_zone)

    _run_loop(main_async)
    return 0


def _kernel_options(args: argparse.Namespace, options: Any) -> Any:
    """``run --proxy-mode iptables|ipvs``: settings with the merged masquerade bit and localhost NodePorts."""
    import dataclasses

    from kproxy.cli.render import kernel_run_options

    merged = argparse.Namespace(**{**vars(args), "kernel": args.kernel or "emulated"})
    run_options = kernel_run_options(merged, options)
    config = dataclasses.replace(run_options.iptables, masquerade_bit=args.iptables_masquerade_bit,
                                 localhost_nodeports=args.iptables_localhost_nodeports)
    return dataclasses.replace(run_options, iptables=config)


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
