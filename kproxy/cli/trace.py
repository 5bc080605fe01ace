"""``kproxy trace``: where does this packet go on this node, and why?

Parsing and printing only. The node's rules come either from manifests (rendered as ``kproxy
render`` would and loaded into an emulated node with kube-proxy's jump rules) or from a node's
dumps (``--iptables-save FILE``; ``--ipvs-dump FILE [--ipset-save FILE] [--iptables-save FILE]``;
``--nft-ruleset FILE``, a node's ``nft list ruleset``), built by :mod:`kproxy.trace.build` and
:mod:`kproxy.trace.nftables`, and the packet goes through :mod:`kproxy.trace`. The
output says which node address of the packet's family the trace used (``node_ips``), and whether
it was the placeholder because no ``--node-ip`` of that family was given (``node_ip_placeholder``).
ipvs-only flags (``--ipvs-scheduler``, ``--connections``) in iptables mode are ignored with a
warning on stderr, as kube-proxy ignores them.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from emulation.errors import NetfilterError
from kproxy.cli.flags import (
    add_config_flag,
    add_manifests_flag,
    add_node_flags,
    add_rule_flags,
    flags_in,
    warn_ignored,
)
from kproxy.cli.nodedump import add_node_dump_flags, node_dump_from_args
from kproxy.cli.progress import document_progress, progress_wanted
from kproxy.cli.render import config_of, print_problems
from kproxy.config import Command, RunConfig
from kproxy.errors import ConfigError, KernelError
from kproxy.kernel.node import EXTERNAL_INTERFACE, trace_node
from kproxy.model import IPFamily
from kproxy.modes import traced_modes
from kproxy.trace.build import (
    iptables_netns,
    ipvs_node,
    netns_from_dump,
    read_manifests,
    read_text,
    snapshot_of,
)
from kproxy.trace.ipvs import node_from_dumps, trace_ipvs
from kproxy.trace.netfilter import TraceResult, format_trace, make_packet, parse_host_port, trace_packet
from kproxy.trace.nftables import netns_from_ruleset, nftables_netns, trace_nftables
from kproxy.trace.nodedump import ONE_INTERFACE_NOTE, NodeDump, dump_netns

__all__ = ["add_parser", "node_addresses", "run", "trace_from_args"]

#: Flags that shape rendered rules: with a node's dump they have no effect (it holds the rules).
_RENDER_FLAGS = ("--hostname-override", "--cluster-cidr", "--masquerade-all", "--nodeport-addresses",
                 "--iptables-masquerade-bit")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``trace`` on the ``kproxy`` subparsers."""
    parser = sub.add_parser(
        "trace", help="follow one packet through the node's rules",
        description="Follow one packet through the rules kproxy would program (--manifests) or a "
                    "node's iptables-save dump (--iptables-save), ipvsadm dump (--ipvs-dump) or nft "
                    "list ruleset output (--nft-ruleset), and print the verdict, the "
                    "endpoints it may reach with their probabilities, whether it is masqueraded, "
                    "and every rule it matched.")
    add_manifests_flag(parser, required=False)
    add_config_flag(parser)
    add_rule_flags(parser, modes=traced_modes(), default_mode="iptables (ipvs with --ipvs-dump)",
                   mode_help="the proxy mode traced")
    add_node_flags(parser)
    parser.add_argument("--iptables-save", default=None, metavar="FILE",
                        help="a node's iptables-save (or iptables-save -c) output, instead of --manifests "
                             "(with --ipvs-dump: the node's remaining iptables rules)")
    parser.add_argument("--ipvs-dump", default=None, metavar="FILE",
                        help="a node's ipvsadm-save -n or ipvsadm -Ln --nosort output, instead of "
                             "--manifests")
    parser.add_argument("--from-run", default=None, metavar="URL",
                        help="trace through a running `kproxy run --kernel emulated` instead: its metrics "
                             "server's URL (such as http://127.0.0.1:10249), asked at /debug/trace; the "
                             "run's own rules, node and conntrack state are used")
    parser.add_argument("--ipset-save", default=None, metavar="FILE",
                        help="with --ipvs-dump: the node's ipset save output")
    parser.add_argument("--nft-ruleset", default=None, metavar="FILE",
                        help="a node's `nft list ruleset` output (every table: kube-proxy's and any "
                             "other component's), instead of --manifests; implies --proxy-mode nftables")
    add_node_dump_flags(parser)
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
    parser.set_defaults(handler=run, subparser=parser)


def _check_sources(args: argparse.Namespace, config: RunConfig) -> str:
    """Refuse a combination of rule sources and ``--proxy-mode`` that means nothing; return the mode.

    Accepted: ``--manifests`` (any traced mode, default iptables); ``--iptables-save`` alone
    (iptables mode); ``--ipvs-dump`` with optional ``--ipset-save`` and ``--iptables-save`` (the
    node's remaining iptables rules; ipvs mode, implied); ``--nft-ruleset`` alone (nftables
    mode, implied).
    """
    mode = config.proxy_mode if "--proxy-mode" in config.given else None
    manifests = bool(config.source.manifests)
    if args.nft_ruleset:
        sources = (("--manifests", manifests), ("--iptables-save", args.iptables_save),
                   ("--ipvs-dump", args.ipvs_dump), ("--ipset-save", args.ipset_save))
        others = [flag for flag, given in sources if given]
        if others:
            raise ConfigError(f"--nft-ruleset FILE is a whole node's nftables ruleset: give it alone, "
                              f"without {', '.join(others)}")
        if mode not in (None, "nftables"):
            raise ConfigError(f"--nft-ruleset FILE is an nftables node's ruleset and implies --proxy-mode "
                              f"nftables: drop --proxy-mode {mode}")
        return "nftables"
    if args.ipvs_dump and manifests:
        raise ConfigError("give either --manifests PATH... or --ipvs-dump FILE, not both")
    if args.ipset_save and not args.ipvs_dump:
        raise ConfigError("--ipset-save goes with --ipvs-dump FILE")
    if args.ipvs_dump and mode == "iptables":
        raise ConfigError("--ipvs-dump FILE is an ipvs node's dump and implies --proxy-mode ipvs: drop "
                          "--proxy-mode iptables (to trace an iptables node, give its iptables-save "
                          "output with --iptables-save FILE alone)")
    if not args.ipvs_dump and manifests == bool(args.iptables_save):
        raise ConfigError("give either --manifests PATH... or --iptables-save FILE (exactly one), "
                          "or --ipvs-dump FILE")
    if args.iptables_save and not args.ipvs_dump and mode == "ipvs":
        raise ConfigError("--proxy-mode ipvs cannot trace --iptables-save FILE alone: an ipvs node's "
                          "Services are in IPVS, not in iptables. Give the node's ipvsadm-save -n output "
                          "with --ipvs-dump FILE (its iptables-save output stays with --iptables-save, its "
                          "ipset save output goes with --ipset-save), or --manifests PATH... to render "
                          "the rules; or drop --proxy-mode ipvs to trace an iptables node's dump")
    return "ipvs" if args.ipvs_dump else config.proxy_mode if manifests else "iptables"


def _node_dump_of(args: argparse.Namespace, config: RunConfig) -> NodeDump | None:
    """The node dump the flags give (``--node-dump DIR`` or the single files), or ``None``;
    ``--node-dump`` supplies ``--iptables-save`` (of the packet's family) when it is not given."""
    dst_ip, _ = parse_host_port(args.dst, flag="--dst", need_port=True)
    version = ipaddress.ip_address(dst_ip).version
    dump = node_dump_from_args(args, trace_node(list(config.node.node_ips)))
    if dump is not None and args.node_dump and not args.iptables_save and not args.ipvs_dump:
        nft = Path(args.node_dump) / "nft-ruleset.txt"
        rules = dump.rules.get(version)
        try:
            empty = rules is None or not Path(rules).read_text(errors="replace").strip()
        except OSError:
            empty = False  # unreadable: reading it below names the file and the reason
        if (config.proxy_mode == "nftables" and "--proxy-mode" in config.given) or (empty and nft.is_file()):
            raise ConfigError(
                f"--node-dump {args.node_dump}: a node dump is traced through its iptables-save.txt, "
                f"which {'is empty' if empty else 'this nftables trace would not use'}; trace its "
                f"nftables rules with --nft-ruleset {nft}, and its interfaces and routes with "
                f"--ip-addr and --ip-route from the same folder")
        if rules is None:
            name = "iptables-save.txt" if version == 4 else "ip6tables-save.txt"
            raise ConfigError(f"--node-dump {args.node_dump}: no {name} (the rules are the one file a "
                              "node dump needs)")
        args.iptables_save = str(rules)
    return dump


def _warn_unused(args: argparse.Namespace, config: RunConfig, mode: str) -> None:
    ipvs_only = flags_in(config.given, ("--ipvs-scheduler",))
    if args.connections is not None:
        ipvs_only.append("--connections")
    if mode in ("iptables", "nftables"):
        warn_ignored(ipvs_only, only="--proxy-mode ipvs", why=f"ignored in {mode} mode")
    why = "{} is a node's dump, which already holds the rules they would shape"
    if args.ipvs_dump:
        warn_ignored(flags_in(config.given, (*_RENDER_FLAGS, "--ipvs-scheduler")),
                     why=why.format("--ipvs-dump FILE"))
    elif args.iptables_save:
        warn_ignored(flags_in(config.given, _RENDER_FLAGS), why=why.format("--iptables-save FILE"))
    elif args.nft_ruleset:
        warn_ignored(flags_in(config.given, (*_RENDER_FLAGS, "--ipvs-scheduler")),
                     why=why.format("--nft-ruleset FILE"))


def trace_from_args(args: argparse.Namespace, config: RunConfig) -> TraceResult:
    """Build the node the flags describe and trace the packet through it (the packet's family is rendered).

    Raises:
        ConfigError: bad flags, neither or both of ``--manifests`` and ``--iptables-save`` (or
            ``--ipvs-dump``), ``--ipvs-dump`` with ``--proxy-mode iptables``, ``--iptables-save``
            alone with ``--proxy-mode ipvs``, an unreadable dump, a missing manifest path.
        KernelError: the rendered rules do not load (a bug: please report it).
    """
    dump = _node_dump_of(args, config)
    mode = _check_sources(args, config)
    dst_ip, _ = parse_host_port(args.dst, flag="--dst", need_port=True)
    family = IPFamily.IPv6 if ipaddress.ip_address(dst_ip).version == 6 else IPFamily.IPv4
    _warn_unused(args, config, mode)
    node_ips = list(config.node.node_ips)
    packet = make_packet(args.src, args.dst, args.proto, node_ips)
    connections = 1 if args.connections is None else args.connections
    if args.ipvs_dump:
        node, notes = node_from_dumps(read_text(args.ipvs_dump, "--ipvs-dump"), node_ips=node_ips,
                                      version=packet.version,
                                      ipset_text=read_text(args.ipset_save, "--ipset-save") if args.ipset_save
                                      else None,
                                      iptables_text=read_text(args.iptables_save, "--iptables-save")
                                      if args.iptables_save else None)
        return trace_ipvs(node, packet, connections=connections, notes=notes)
    if args.nft_ruleset:
        text = read_text(args.nft_ruleset, "--nft-ruleset")
        read = ("read from a node's nft list ruleset: every table of the packet's family runs at its "
                "hooks in priority order",)
        return trace_nftables(netns_from_ruleset(text, node_ips, source=f"--nft-ruleset {args.nft_ruleset}"),
                              packet, notes=read)
    if args.iptables_save:
        netns = netns_from_dump(args.iptables_save, packet.version, node_ips)
        trace_notes: tuple[str, ...] = ()
        if dump is not None:
            netns, packet, trace_notes = dump_netns(netns, dump, packet, args.in_interface)
        elif args.in_interface:
            raise ConfigError("--in-interface IF needs the node's interfaces: give --node-dump DIR or "
                              "--ip-addr FILE")
        else:
            trace_notes = (ONE_INTERFACE_NOTE,)
        try:
            return replace(trace_packet(netns, packet), notes=trace_notes)
        except NetfilterError as err:
            raise ConfigError(f"--iptables-save {args.iptables_save}: {err}") from None
    with document_progress(enabled=progress_wanted()) as report:
        manifests = read_manifests(config.source.manifests, progress=report)
    print_problems(manifests)
    snapshot = snapshot_of(config, manifests)
    if mode == "ipvs":
        return trace_ipvs(ipvs_node(config, snapshot, family), packet, connections=connections,
                          zero_builtin_lines=True)
    if mode == "nftables":
        return trace_nftables(nftables_netns(config, snapshot, family), packet,
                              notes=("lines are those of `kproxy render --proxy-mode nftables`",))
    return replace(trace_packet(iptables_netns(config, snapshot, family), packet, zero_builtin_lines=True),
                   notes=(ONE_INTERFACE_NOTE,))


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``kproxy trace``: print the result (text, or JSON with ``--json``); exit status 0.

    Raises:
        ConfigError: see :func:`trace_from_args`.
        KernelError: see :func:`trace_from_args`.
    """
    if args.from_run is not None:
        return _trace_from_run(args)
    config = config_of(args, parser, Command.TRACE)
    try:
        result = trace_from_args(args, config)
    except KernelError as err:
        raise KernelError(f"the rendered rules did not load into the emulated node: {err}") from err
    addresses, placeholder = node_addresses(config.node.node_ips, result.packet.version)
    dump = node_dump_from_args(args, trace_node(list(config.node.node_ips)))
    if dump is not None and (args.node_dump or args.ip_addr):
        version = result.packet.version
        addresses = tuple(a.partition("/")[0] for i in dump.node.interfaces if i.name != "lo"
                          for n, a in enumerate(i.addresses)
                          if i.scope(n) == "global" and ipaddress.ip_interface(a).version == version)
        placeholder = False
    out = result.to_json()
    if args.json:
        out.update(node_ips=list(addresses), node_ip_placeholder=placeholder)
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        first, _, rest = format_trace(result).partition("\n")
        extra = "" if result.ipvs else "".join(f"note: {n}\n" for n in result.notes)
        if out["delivery"]:
            extra += f"delivery: {out['delivery']}\n"
        sys.stdout.write(f"{first}\n{_node_line(addresses, placeholder)}\n{rest}{extra}")
    return 0


def node_addresses(node_ips: Sequence[str], version: int) -> tuple[tuple[str, ...], bool]:
    """The node addresses of IP ``version`` the trace used, and whether they were invented.

    The traced node (:func:`~kproxy.kernel.node.trace_node`) carries the ``--node-ip``
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


def _trace_from_run(args: argparse.Namespace) -> int:
    """``--from-run URL``: ask the running kproxy's ``/debug/trace`` and print its answer.

    Raises:
        ConfigError: rule flags given beside it, the run cannot be reached, or it refused the query.
    """
    given = (("--manifests", getattr(args, "manifests", None)), ("--iptables-save", args.iptables_save),
             ("--ipvs-dump", args.ipvs_dump), ("--ipset-save", args.ipset_save))
    beside = [flag for flag, value in given if value]
    if beside:
        raise ConfigError(f"--from-run URL traces the running kproxy's own rules; drop {', '.join(beside)}")
    query = {"src": args.src, "dst": args.dst, "proto": args.proto, "format": "json" if args.json else "text"}
    if args.connections is not None:
        query["connections"] = str(args.connections)
    base = args.from_run.rstrip("/")
    if "://" not in base:
        base = f"http://{base}"
    url = f"{base}/debug/trace?{urllib.parse.urlencode(query)}"
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            sys.stdout.write(answer.read().decode())
    except urllib.error.HTTPError as err:
        raise ConfigError(f"--from-run {args.from_run}: {err.read().decode().strip() or err}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise ConfigError(f"--from-run {args.from_run}: cannot reach the running kproxy at {url}: {reason} "
                          "(is it running with --kernel emulated, and is this its --metrics-bind-address?)"
                          ) from None
    return 0
