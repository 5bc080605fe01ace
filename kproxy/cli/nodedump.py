"""``kproxy node-dump --out DIR``, and the flags that read a node dump (``--node-dump``, ``--ip-*``).

Parsing and printing only: :mod:`kproxy.trace.nodedump` writes and reads the directory (its
layout is the contract described there and in the README).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from emulation import Node
from kproxy.errors import ConfigError
from kproxy.trace.nodedump import NodeDump, read_node_dump, write_node_dump

__all__ = ["add_node_dump_flags", "add_parser", "node_dump_from_args", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``node-dump`` on the ``kproxy`` subparsers."""
    parser = sub.add_parser(
        "node-dump", help="write this node's rules, interfaces, routes and sysctls to a directory",
        description="Run iptables-save -c, ip6tables-save -c, nft list ruleset (when present), ipset save, "
                    "ip -j addr/route/link show and sysctl in the current network namespace (as root) and "
                    "write each output as the tool prints it, plus /proc/net/xt_recent/*, to DIR, for "
                    "kproxy trace/verify --node-dump DIR.")
    parser.add_argument("--out", required=True, metavar="DIR", help="the directory to write (created)")
    parser.set_defaults(handler=run, subparser=parser)


def add_node_dump_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--node-dump DIR``, ``--ip-addr FILE``, ``--ip-route FILE``, ``--ip-link FILE`` and
    ``--in-interface IF`` to ``parser``."""
    group = parser.add_argument_group("node state (see `kproxy node-dump`)")
    group.add_argument("--node-dump", default=None, metavar="DIR",
                       help="a node dump directory: its rules (iptables-save.txt) unless --iptables-save "
                            "is given, and its interfaces, routes, bridges, sysctls and recent lists")
    group.add_argument("--ip-addr", default=None, metavar="FILE", help="the node's `ip -j addr show` output")
    group.add_argument("--ip-route", default=None, metavar="FILE",
                       help="the node's `ip -j route show table all` output")
    group.add_argument("--ip-link", default=None, metavar="FILE", help="the node's `ip -j link show` output")
    group.add_argument("--in-interface", default=None, metavar="IF",
                       help="the interface the packet arrives on (default: the one the route back to "
                            "its source leaves by); needs the node's interfaces")


def node_dump_from_args(args: argparse.Namespace, defaults: Node) -> NodeDump | None:
    """The node dump the flags name, ``None`` when none of them is given.

    Raises:
        ConfigError: see :func:`kproxy.trace.nodedump.read_node_dump`.
    """
    if not any((args.node_dump, args.ip_addr, args.ip_route, args.ip_link)):
        return None
    return read_node_dump(args.node_dump, ip_addr=args.ip_addr, ip_route=args.ip_route, ip_link=args.ip_link,
                          defaults=defaults)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``kproxy node-dump``: write the directory and list its files; exit status 0.

    Raises:
        ConfigError: not root, or ``--out`` cannot be created.
        KernelError: a tool failed.
    """
    if os.geteuid() != 0:
        raise ConfigError("node-dump reads the node's rules and needs root (iptables-save, ipset save)")
    written = write_node_dump(Path(args.out))
    sys.stdout.write("".join(f"{args.out.rstrip('/')}/{name}\n" for name in written))
    return 0
