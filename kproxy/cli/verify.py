"""``kproxy verify``: do the modes agree on this cluster? Does this node's dump behave as kproxy would?

Packets are generated for the cluster with :func:`kproxy.testing.packets` (Hypothesis, seeded,
no example database), every mode answers each one (:func:`kproxy.testing.compare`), and the
first disagreement is shrunk to a minimal packet and printed with every mode's outcome side by
side and every trace. With ``--iptables-save FILE`` the comparison is between the node's dump
(read leniently, other components' rules included) and the rules kproxy would render for the
same cluster, both run in the emulator: it compares behaviour (where each packet goes, with what
probability, masqueraded or not), so renamed chains or reordered independent rules are not
differences (the dump must be a node's ``iptables-save``, with the jump rules from the built-in
chains that kube-proxy installs outside its restore; ``kproxy render`` output lacks them). With
``--node-ip``, only the families the node has an address of are checked, as kube-proxy proxies a
family only when the node has it. Exit status: 0 when everything agrees, 1 with the minimal
disagreement, 2 for bad flags or input (a missing manifest path, an empty or unreadable dump,
manifests with problems or without any service port, unless ``--allow-problems``).
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import socket
import sys
from collections import Counter

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from emulation.errors import NetfilterError
from emulation.netfilter import load
from kproxy.cli.render import nodeport_addresses
from kproxy.cli.trace import read_text
from kproxy.errors import ConfigError, InvalidArgument, SourceError
from kproxy.model import EndpointSlice, IPFamily, Service
from kproxy.testing import Cluster, Comparison, NodeSpec, compare, packets
from kproxy.testing.equivalence import format_comparison
from kproxy.testing.modes import DEFAULT_MODES, DumpAdapter, ModeAdapter, available_modes, get_mode

__all__ = ["add_parser", "node_from_args", "run", "search"]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``verify`` on the ``kproxy`` subparsers."""
    parser = sub.add_parser(
        "verify", help="check that every mode (or a node's dump) forwards the cluster alike",
        description="Generate packets for the cluster, run every mode on each, and exit 0 when they "
                    "agree, 1 with the minimal disagreeing packet when they do not. With "
                    "--iptables-save, compare a node's dump with what kproxy would render, by behaviour.")
    parser.add_argument("--manifests", nargs="+", metavar="PATH", required=True,
                        help="YAML or JSON files or folders with Services and EndpointSlices")
    node = parser.add_argument_group("node")
    node.add_argument("--hostname-override", default=None, metavar="NAME",
                      help="this node's name; endpoints with this nodeName are local (default: host name)")
    node.add_argument("--node-ip", action="append", default=[], metavar="IP",
                      help="a node IP (at most one per family; default 192.168.0.2 and 2001:db8::2); "
                           "only the families given are checked")
    node.add_argument("--ip-family", default=None, choices=("IPv4", "IPv6"),
                      help="the family checked (default: the --node-ip families, else both; with "
                           "--iptables-save, the first --node-ip's)")
    ipt = parser.add_argument_group("iptables")
    ipt.add_argument("--cluster-cidr", default=None, metavar="CIDR[,CIDR]",
                     help="pod CIDRs (default 10.244.0.0/16,fd00:10:244::/48); this node's pods are "
                          "the first /24 (/64) of each")
    ipt.add_argument("--masquerade-all", action="store_true", help="masquerade all ClusterIP traffic")
    ipt.add_argument("--nodeport-addresses", default=None, metavar="CIDR[,CIDR]|primary",
                     help="addresses NodePorts answer on: CIDRs (IP/32 for one address) or primary "
                          "(default: every local address)")
    check = parser.add_argument_group("check")
    check.add_argument("--modes", default=None, metavar="LIST",
                       help=f"modes compared, comma-separated (default {','.join(DEFAULT_MODES)}; "
                            f"available: {','.join(available_modes())})")
    check.add_argument("--examples", type=int, default=500, metavar="N",
                       help="packets generated (default 500)")
    check.add_argument("--seed", type=int, default=0, metavar="S", help="the generator's seed (default 0)")
    check.add_argument("--iptables-save", default=None, metavar="FILE",
                       help="a node's iptables-save (or -c) output to compare with kproxy's rules (not "
                            "`kproxy render` output: it lacks the jumps from the built-in chains)")
    check.add_argument("--allow-problems", action="store_true",
                       help="check even when the manifests had problems or yield no service port "
                            "(default: exit 2 listing them)")
    parser.set_defaults(handler=run)


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip()) if text else ()


def _node_ips(args: argparse.Namespace) -> tuple[str, ...]:
    seen: dict[int, str] = {}
    for ip in args.node_ip:
        try:
            version = ipaddress.ip_address(ip.strip()).version
        except ValueError:
            raise ConfigError(f"--node-ip: expected an IP address, got {ip!r}") from None
        if version in seen:
            raise ConfigError(f"--node-ip: at most one address per family, got {seen[version]} and {ip}")
        seen[version] = ip.strip()
    return tuple(seen.values())


def _families(args: argparse.Namespace, node_ips: tuple[str, ...]) -> tuple[IPFamily, ...]:
    """The families checked: kube-proxy proxies a family only when the node has an address of it."""
    have = tuple(IPFamily.IPv6 if ":" in ip else IPFamily.IPv4 for ip in node_ips)
    if args.ip_family:
        family = IPFamily(args.ip_family)
        if node_ips and family not in have:
            raise ConfigError(f"--ip-family {family}: no --node-ip of that family "
                              f"(given: {', '.join(node_ips)})")
        return (family,)
    if args.iptables_save:
        return have[:1] or (IPFamily.IPv4,)
    return have or (IPFamily.IPv4, IPFamily.IPv6)


def node_from_args(args: argparse.Namespace) -> NodeSpec:
    """The node the flags describe.

    Raises:
        ConfigError: a malformed address or CIDR (naming the flag).
    """
    hostname = (args.hostname_override or socket.gethostname()).strip().lower()
    cidrs = _csv(args.cluster_cidr) or NodeSpec().cluster_cidrs
    local = []
    for cidr in cidrs:
        try:
            net = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(f"--cluster-cidr: expected CIDRs, got {cidr!r}") from None
        size = 24 if net.version == 4 else 64
        local.append(str(next(net.subnets(new_prefix=size)) if net.prefixlen < size else net))
    node_ips = _node_ips(args)
    try:
        return NodeSpec(hostname=hostname, node_ips=node_ips or NodeSpec().node_ips,
                        cluster_cidrs=cidrs, local_pod_cidrs=tuple(local), masquerade_all=args.masquerade_all,
                        nodeport_addresses=nodeport_addresses(args.nodeport_addresses),
                        families=_families(args, node_ips))
    except InvalidArgument as err:
        raise ConfigError(f"node flags (--node-ip, --cluster-cidr): {err}") from None


def search(cluster: Cluster, modes: list[str | ModeAdapter], *, examples: int, seed: int,
           tally: Counter[str] | None = None) -> Comparison | None:
    """Generate up to ``examples`` packets and return the minimal disagreement, or None.

    Args:
        cluster: the cluster.
        modes: the modes compared.
        examples: packets to generate (Hypothesis ``max_examples``).
        seed: the generator's seed.
        tally: counts ``"packets"`` and each known difference that applied.

    Raises:
        InvalidArgument: an unknown mode, or no packet can be generated for the cluster.
    """
    strategy = packets(cluster)
    failures: list[Comparison] = []
    counts: Counter[str] = tally if tally is not None else Counter()

    @hypothesis_seed(seed)
    @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
              phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
              print_blob=False, report_multiple_bugs=False)
    @given(strategy)
    def check(packet: object) -> None:
        result = compare(cluster, packet, modes)  # type: ignore[arg-type]
        counts["packets"] += 1
        for difference in result.excused:
            counts[difference.name] += 1
        if not result.equivalent:
            failures.append(result)
            raise AssertionError("modes disagree")

    try:
        check()
    except AssertionError:
        if not failures:
            raise
        return failures[-1]  # Hypothesis replays the minimal failing example last
    return None


_JUMP_TO_SERVICES = re.compile(r"^(?:\[\d+:\d+\]\s+)?-A\s+(PREROUTING|OUTPUT)\s.*-j\s+KUBE-SERVICES(\s|$)")


def _check_dump(path: str, text: str) -> None:
    """Refuse an empty dump, and one with KUBE chains but no jump into them (``kproxy render`` output).

    Raises:
        ConfigError: saying which, and what to give instead.
    """
    lines = [line.strip() for line in text.splitlines()]
    if not any(line and not line.startswith("#") for line in lines):
        raise ConfigError(f"--iptables-save {path}: the file is empty; give a node's iptables-save output")
    table = ""
    kube = jumps = False
    for line in lines:
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":KUBE-"):
            kube = True
        elif table == "nat" and _JUMP_TO_SERVICES.match(line):
            jumps = True
    if kube and not jumps:
        raise ConfigError(f"--iptables-save {path}: the dump has no jump rules into KUBE-SERVICES: was it "
                          "made with `kproxy render`? A node's `iptables-save` has them (kube-proxy "
                          "installs the jumps from PREROUTING and OUTPUT outside its restore)")


def _dump_adapter(path: str, family: IPFamily) -> DumpAdapter:
    text = read_text(path, "--iptables-save")
    _check_dump(path, text)
    try:
        ruleset = load(text, version=6 if family is IPFamily.IPv6 else 4, strict=False)
    except NetfilterError as err:
        raise ConfigError(f"--iptables-save {path}: {err}") from None
    return DumpAdapter(ruleset, name="node-dump")


def run(args: argparse.Namespace) -> int:
    """``kproxy verify``: 0 when everything agrees, 1 with the minimal disagreement.

    Raises:
        ConfigError: a bad flag value, a missing manifest path, an empty, unreadable or rendered
            dump, an unknown mode, or manifests with problems or no service port (without
            ``--allow-problems``).
    """
    from kproxy.sources.manifests import load_manifests

    if args.examples < 1:
        raise ConfigError(f"--examples: expected a count >= 1, got {args.examples}")
    if args.modes is not None and args.iptables_save:
        raise ConfigError("--modes does not go with --iptables-save (which compares iptables with the dump)")
    if args.modes is not None and not _csv(args.modes):
        raise ConfigError(f"--modes: expected mode names, comma-separated, got {args.modes!r}; "
                          f"available: {','.join(available_modes())}")
    node = node_from_args(args)
    try:
        objects, problems = load_manifests(args.manifests)
    except SourceError as err:
        raise ConfigError(f"--manifests: {err}") from None
    for problem in problems:
        print(f"kproxy: warning: {problem}", file=sys.stderr)
    cluster = Cluster.from_objects([o for o in objects if isinstance(o, Service)],
                                   [o for o in objects if isinstance(o, EndpointSlice)], node)
    families = ",".join(node.families)
    if not args.allow_problems and (problems or not cluster.snapshot):
        why = [f"  {p}" for p in problems]
        if not cluster.snapshot:
            why.append(f"  the manifests yield no service port of {families} on node {node.hostname!r}")
        raise ConfigError("--manifests: refusing to check (nothing would be proven):\n" + "\n".join(why)
                          + "\nfix the manifests, or pass --allow-problems to check what was read")
    modes: list[str | ModeAdapter]
    try:
        if args.iptables_save:
            modes = [get_mode("iptables"), _dump_adapter(args.iptables_save, node.families[0])]
        else:
            modes = list(_csv(args.modes) or DEFAULT_MODES)
            for m in modes:
                get_mode(m)
        tally: Counter[str] = Counter()
        failure = search(cluster, modes, examples=args.examples, seed=args.seed, tally=tally)
    except InvalidArgument as err:
        raise ConfigError(str(err)) from None
    names = [m if isinstance(m, str) else m.name for m in modes]
    if failure is not None:
        print(f"kproxy verify: {' and '.join(names)} disagree (families checked: {families}); "
              "the minimal packet:\n", file=sys.stdout)
        print(format_comparison(failure))
        return 1
    known = ", ".join(f"{k} x{v}" for k, v in sorted(tally.items()) if k != "packets")
    print(f"kproxy verify: {', '.join(names)} agree on {tally['packets']} packets "
          f"({len(cluster.snapshot)} service ports; families checked: {families}; seed {args.seed})"
          + (f"; known differences: {known}" if known else ""))
    return 0
