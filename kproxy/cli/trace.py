"""``kproxy trace``: where does this packet go on this node, and why?

The node's rules come either from manifests (rendered as ``kproxy render`` would, loaded into an
emulated node with kube-proxy's jump rules) or from ``--iptables-save FILE``, a real node's dump
as ``iptables-save`` or ``iptables-save -c`` prints it, other components' rules included (read
leniently: a match the emulator does not model is reported as unknown, never silently taken).
With ``--proxy-mode ipvs`` (or ``--ipvs-dump FILE [--ipset-save FILE] [--iptables-save FILE]``,
a real node's dumps) the packet goes through an IPVS node (:mod:`kproxy.trace.ipvs`).
The work is in :mod:`kproxy.trace.netfilter`; this module only wires flags to it, and says which
node address of the packet's family the trace used (``node_ips``), and whether it was the
placeholder because no ``--node-ip`` of that family was given (``node_ip_placeholder``).
ipvs-only flags (``--ipvs-scheduler``, ``--connections``) in iptables mode are ignored with a
warning on stderr, as kube-proxy ignores them.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from emulation import ManualClock
from emulation.errors import NetfilterError
from emulation.netfilter import Netns, Ruleset, load
from kproxy.cli.render import (
    add_cluster_flags,
    config_from_args,
    flags_given,
    ipvs_config_from_args,
    snapshot_from_args,
    warn_ignored_flags,
    warn_unused_ipvs_flags,
)
from kproxy.errors import ConfigError, KernelError
from kproxy.kernel.emulated import EmulatedNetfilter
from kproxy.model import IPFamily
from kproxy.modes.iptables import IptablesRenderer, nfacct_counters
from kproxy.modes.iptables.mode import load_now
from kproxy.trace.netfilter import (
    EXTERNAL_INTERFACE,
    TraceResult,
    find_chain_loop,
    format_trace,
    make_packet,
    parse_host_port,
    trace_node,
    trace_packet,
)

__all__ = ["add_parser", "node_addresses", "read_text", "run", "trace_from_args"]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``trace`` on the ``kproxy`` subparsers."""
    parser = sub.add_parser(
        "trace", help="follow one packet through the node's rules",
        description="Follow one packet through the rules kproxy would program (--manifests) or a "
                    "node's iptables-save dump (--iptables-save), and print the verdict, the "
                    "endpoints it may reach with their probabilities, whether it is masqueraded, "
                    "and every rule it matched.")
    add_cluster_flags(parser, manifests_required=False)
    parser.set_defaults(proxy_mode=None)  # iptables, or ipvs with --ipvs-dump: see _check_sources
    parser.add_argument("--iptables-save", default=None, metavar="FILE",
                        help="a node's iptables-save (or iptables-save -c) output, instead of --manifests "
                             "(with --ipvs-dump: the node's remaining iptables rules)")
    parser.add_argument("--ipvs-dump", default=None, metavar="FILE",
                        help="a node's ipvsadm-save -n or ipvsadm -Ln --nosort output, instead of "
                             "--manifests")
    parser.add_argument("--ipset-save", default=None, metavar="FILE",
                        help="with --ipvs-dump: the node's ipset save output")
    parser.add_argument("--connections", type=int, default=None, metavar="N",
                        help="ipvs: simulate N new connections from the source (source ports counting "
                             "up) and report each endpoint's share (default 1; ignored with a warning in "
                             "iptables mode)")
    pkt = parser.add_argument_group("packet")
    pkt.add_argument("--src", required=True, metavar="IP[:PORT]",
                     help="source; a --node-ip or loopback source is generated on the node (OUTPUT)")
    pkt.add_argument("--dst", required=True, metavar="IP:PORT", help="destination")
    pkt.add_argument("--proto", default="tcp", choices=("tcp", "udp", "sctp"), help="protocol (default tcp)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (see README)")
    parser.set_defaults(handler=run)


def read_text(path: str, flag: str) -> str:
    """The UTF-8 text of the file ``path`` given with ``flag``.

    Raises:
        ConfigError: the file cannot be read or is not UTF-8 text (naming the flag and file).
    """
    try:
        return Path(path).read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigError(f"{flag}: cannot read {path!r}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{flag} {path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset "
                          f"{err.start}; give the text iptables-save prints)") from None


def _netns_from_dump(path: str, version: int, node_ips: list[str]) -> Netns:
    text = read_text(path, "--iptables-save")
    try:
        ruleset = load(text, version=version, strict=False)
    except NetfilterError as err:
        raise ConfigError(f"--iptables-save {path}: {err}") from None
    loop = find_chain_loop(ruleset)
    if loop is not None:
        raise ConfigError(f"--iptables-save {path}: {loop}")
    return Netns(trace_node(node_ips), ManualClock(), ruleset=ruleset)


def _netns_from_manifests(args: argparse.Namespace, family: IPFamily) -> Netns:
    config = config_from_args(args, family)
    result = IptablesRenderer(config).render(snapshot_from_args(args))
    netns = Netns(trace_node(config.node_ips), ManualClock(),
                  ruleset=Ruleset(6 if family is IPFamily.IPv6 else 4))
    load_now(EmulatedNetfilter(netns, family), result, nfacct=nfacct_counters(config))
    return netns


def _read(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    return read_text(path, flag)


def _trace_ipvs(args: argparse.Namespace, family: IPFamily) -> TraceResult:
    from kproxy.modes.ipvs import render
    from kproxy.trace.ipvs import node_from_dumps, node_from_render, trace_ipvs

    packet = make_packet(args.src, args.dst, args.proto, args.node_ip)
    connections = 1 if args.connections is None else args.connections
    if args.ipvs_dump:
        text = _read(args.ipvs_dump, "--ipvs-dump")
        assert text is not None
        node, notes = node_from_dumps(text, node_ips=list(args.node_ip), version=packet.version,
                                      ipset_text=_read(args.ipset_save, "--ipset-save"),
                                      iptables_text=_read(args.iptables_save, "--iptables-save"))
        return trace_ipvs(node, packet, connections=connections, notes=notes)
    rendered = render(snapshot_from_args(args), ipvs_config_from_args(args, family))
    node = node_from_render(rendered, list(args.node_ip))
    return trace_ipvs(node, packet, connections=connections, zero_builtin_lines=True)


#: Flags that shape rendered rules: with a node's dump they have no effect (it holds the rules).
_RENDER_FLAGS = (("--hostname-override", "hostname_override"), ("--cluster-cidr", "cluster_cidr"),
                 ("--masquerade-all", "masquerade_all"), ("--nodeport-addresses", "nodeport_addresses"),
                 ("--iptables-masquerade-bit", "iptables_masquerade_bit"))


def _check_sources(args: argparse.Namespace) -> str:
    """Refuse a combination of rule sources and ``--proxy-mode`` that means nothing; return the mode.

    Accepted: ``--manifests`` (either mode, default iptables); ``--iptables-save`` alone
    (iptables mode); ``--ipvs-dump`` with optional ``--ipset-save`` and ``--iptables-save`` (the
    node's remaining iptables rules; ipvs mode, implied).
    """
    mode: str | None = args.proxy_mode
    if args.ipvs_dump and args.manifests:
        raise ConfigError("give either --manifests PATH... or --ipvs-dump FILE, not both")
    if args.ipset_save and not args.ipvs_dump:
        raise ConfigError("--ipset-save goes with --ipvs-dump FILE")
    if args.ipvs_dump and mode == "iptables":
        raise ConfigError("--ipvs-dump FILE is an ipvs node's dump and implies --proxy-mode ipvs: drop "
                          "--proxy-mode iptables (to trace an iptables node, give its iptables-save "
                          "output with --iptables-save FILE alone)")
    if not args.ipvs_dump and bool(args.manifests) == bool(args.iptables_save):
        raise ConfigError("give either --manifests PATH... or --iptables-save FILE (exactly one), "
                          "or --ipvs-dump FILE")
    if args.iptables_save and not args.ipvs_dump and mode == "ipvs":
        raise ConfigError("--proxy-mode ipvs cannot trace --iptables-save FILE alone: an ipvs node's "
                          "Services are in IPVS, not in iptables. Give the node's ipvsadm-save -n output "
                          "with --ipvs-dump FILE (its iptables-save output stays with --iptables-save, its "
                          "ipset save output goes with --ipset-save), or --manifests PATH... to render "
                          "the rules; or drop --proxy-mode ipvs to trace an iptables node's dump")
    return "ipvs" if args.ipvs_dump else mode or "iptables"


def trace_from_args(args: argparse.Namespace) -> TraceResult:
    """Build the node the flags describe and trace the packet through it.

    With a node's dump (``--iptables-save`` or ``--ipvs-dump``) the flags that shape rendered
    rules (``--hostname-override``, ``--cluster-cidr``, ``--masquerade-all``,
    ``--nodeport-addresses``, ``--iptables-masquerade-bit``, and ``--ipvs-scheduler``) have no
    effect; any given is named in one warning line on stderr.

    Raises:
        ConfigError: bad flags, neither or both of ``--manifests`` and ``--iptables-save`` (or
            ``--ipvs-dump``), ``--ipvs-dump`` with ``--proxy-mode iptables``, ``--iptables-save``
            alone with ``--proxy-mode ipvs``, an unreadable dump.
        KernelError: the rendered rules do not load (a bug: please report it).
        SourceError: a manifest path does not exist.
    """
    mode = _check_sources(args)
    dst_ip, _ = parse_host_port(args.dst, flag="--dst", need_port=True)
    family = IPFamily.IPv6 if ipaddress.ip_address(dst_ip).version == 6 else IPFamily.IPv4
    if mode == "iptables":
        warn_unused_ipvs_flags(args)
    if args.ipvs_dump:
        ignored = flags_given(args, (*_RENDER_FLAGS, ("--ipvs-scheduler", "ipvs_scheduler")))
        warn_ignored_flags(ignored, why="--ipvs-dump FILE is a node's dump, which already holds the "
                                        "rules they would shape")
    elif args.iptables_save:
        warn_ignored_flags(flags_given(args, _RENDER_FLAGS),
                           why="--iptables-save FILE is a node's dump, which already holds the rules they "
                               "would shape")
    if mode == "ipvs":
        return _trace_ipvs(args, family)
    packet = make_packet(args.src, args.dst, args.proto, args.node_ip)
    if args.iptables_save:
        netns = _netns_from_dump(args.iptables_save, packet.version, list(args.node_ip))
        try:
            return trace_packet(netns, packet)
        except NetfilterError as err:
            raise ConfigError(f"--iptables-save {args.iptables_save}: {err}") from None
    netns = _netns_from_manifests(args, family)
    return trace_packet(netns, packet, zero_builtin_lines=True)


def run(args: argparse.Namespace) -> int:
    """``kproxy trace``: print the result (text, or JSON with ``--json``); exit status 0.

    Raises:
        ConfigError: see :func:`trace_from_args`.
        KernelError: see :func:`trace_from_args`.
    """
    try:
        result = trace_from_args(args)
    except KernelError as err:
        raise KernelError(f"the rendered rules did not load into the emulated node: {err}") from err
    addresses, placeholder = node_addresses(args.node_ip, result.packet.version)
    if args.json:
        out = result.to_json()
        out.update(node_ips=list(addresses), node_ip_placeholder=placeholder)
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        first, _, rest = format_trace(result).partition("\n")
        sys.stdout.write(f"{first}\n{_node_line(addresses, placeholder)}\n{rest}")
    return 0


def node_addresses(node_ips: Sequence[str], version: int) -> tuple[tuple[str, ...], bool]:
    """The node addresses of IP ``version`` the trace used, and whether they were invented.

    The traced node (:func:`~kproxy.trace.netfilter.trace_node`) carries the ``--node-ip``
    addresses, loopback left out, or a TEST-NET placeholder for a family with none; MASQUERADE
    picks it and a NodePort on it is local, so the user is told when it was made up.

    Returns:
        ``(addresses, placeholder)``: the family's addresses on ``eth0`` in order, and True when
        that is the placeholder because no non-loopback ``--node-ip`` of the family was given.

    Raises:
        ConfigError: a ``--node-ip`` is not an IP address.
    """
    eth0 = next(i for i in trace_node(node_ips).interfaces if i.name == EXTERNAL_INTERFACE)
    addresses = tuple(a.partition("/")[0] for a in eth0.addresses
                      if ipaddress.ip_interface(a).version == version)
    given = any(ipaddress.ip_address(ip).version == version and not ipaddress.ip_address(ip).is_loopback
                for ip in node_ips)
    return addresses, not given


def _node_line(addresses: Sequence[str], placeholder: bool) -> str:
    if placeholder:
        return f"node address: {', '.join(addresses)} (placeholder; pass --node-ip)"
    return f"node address{'es' if len(addresses) > 1 else ''}: {', '.join(addresses)}"
