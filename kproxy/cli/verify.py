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
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from kproxy.cli.flags import add_config_flag, add_manifests_flag, add_node_flags, add_rule_flags, given_flags
from kproxy.cli.progress import document_progress, progress_wanted, step_progress
from kproxy.cli.render import print_problems
from kproxy.config import Command, RunConfig, build_run_config
from kproxy.errors import ConfigError, InvalidArgument
from kproxy.testing import Cluster, Comparison, NodeSpec, compare, packets
from kproxy.testing.affinity import AFFINITY_CONNECTIONS, affinity_breaks, affinity_clients
from kproxy.testing.equivalence import format_comparison
from kproxy.testing.modes import DEFAULT_MODES, DumpAdapter, ModeAdapter, available_modes, get_mode
from kproxy.trace.build import load_node_dump, read_manifests

__all__ = ["add_parser", "node_from_args", "run", "search"]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``verify`` on the ``kproxy`` subparsers."""
    parser = sub.add_parser(
        "verify", help="check that every mode (or a node's dump) forwards the cluster alike",
        description="Generate packets for the cluster, run every mode on each, and exit 0 when they "
                    "agree, 1 with the minimal disagreeing packet when they do not. With "
                    "--iptables-save, compare a node's dump with what kproxy would render, by behaviour.")
    add_manifests_flag(parser, required=True)
    add_config_flag(parser)
    add_node_flags(parser, node_ip_help=" (default 192.168.0.2 and 2001:db8::2); only the families of "
                                        "the node IPs are checked")
    add_rule_flags(parser, modes=None, default_mode="", mode_help="")
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
    check.add_argument("--node-dump", default=None, metavar="DIR",
                       help="a `kproxy node-dump` directory: its iptables-save.txt is the dump compared "
                            "(instead of --iptables-save)")
    check.add_argument("--pod-cidr", default=None, metavar="CIDR", action="append",
                       help="this node's pod range (one per family; default: the first /24 or /64 of "
                            "--cluster-cidr), as flannel's or the node's spec.podCIDR")
    check.add_argument("--allow-problems", action="store_true",
                       help="check even when the manifests had problems or yield no service port "
                            "(default: exit 2 listing them)")
    parser.set_defaults(handler=run, subparser=parser)


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip()) if text else ()


def node_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[NodeSpec, RunConfig]:
    """The node the flags (and ``--config``) describe, and the configuration it came from.

    Raises:
        ConfigError: a malformed address or CIDR (naming the flag).
    """
    if getattr(args, "node_dump", None):
        if args.iptables_save:
            raise ConfigError("give either --node-dump DIR or --iptables-save FILE, not both")
        rules = Path(args.node_dump) / "iptables-save.txt"
        if not rules.is_file():
            raise ConfigError(f"--node-dump {args.node_dump}: no iptables-save.txt (the rules are the one "
                              "file a node dump needs)")
        args.iptables_save = str(rules)
    config = build_run_config(given_flags(args, parser), command=Command.VERIFY)
    spec = NodeSpec.from_run(config, primary_family_only=bool(args.iptables_save))
    if getattr(args, "pod_cidr", None):
        try:
            spec = replace(spec, local_pod_cidrs=tuple(args.pod_cidr))
        except InvalidArgument as err:
            raise ConfigError(f"--pod-cidr: {err}") from None
    return spec, config


def search(cluster: Cluster, modes: list[str | ModeAdapter], *, examples: int, seed: int,
           tally: Counter[str] | None = None, step: Callable[[], None] | None = None) -> Comparison | None:
    """Generate up to ``examples`` packets and return the minimal disagreement, or None.

    Args:
        cluster: the cluster.
        modes: the modes compared.
        examples: packets to generate (Hypothesis ``max_examples``).
        seed: the generator's seed.
        tally: counts ``"packets"`` and each known difference that applied.
        step: called after each packet (a progress bar).

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
        if step is not None:
            step()
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


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``kproxy verify``: 0 when everything agrees, 1 with the minimal disagreement.

    Raises:
        ConfigError: a bad flag value, a missing manifest path, an empty, unreadable or rendered
            dump, an unknown mode, or manifests with problems or no service port (without
            ``--allow-problems``).
    """
    if args.examples < 1:
        raise ConfigError(f"--examples: expected a count >= 1, got {args.examples}")
    if args.modes is not None and args.iptables_save:
        raise ConfigError("--modes does not go with --iptables-save (which compares iptables with the dump)")
    if args.modes is not None and not _csv(args.modes):
        raise ConfigError(f"--modes: expected mode names, comma-separated, got {args.modes!r}; "
                          f"available: {','.join(available_modes())}")
    node, config = node_from_args(args, parser)
    with document_progress(enabled=progress_wanted()) as report:
        manifests = read_manifests(config.source.manifests, progress=report)
    print_problems(manifests)
    problems = manifests.problems
    cluster = Cluster.from_objects(list(manifests.services), list(manifests.slices), node)
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
            modes = [get_mode("iptables"),
                     DumpAdapter(load_node_dump(args.iptables_save, node.families[0]), name="node-dump")]
        else:
            modes = list(_csv(args.modes) or DEFAULT_MODES)
            for m in modes:
                get_mode(m)
        tally: Counter[str] = Counter()
        with step_progress("checking packets", args.examples, unit=" packets",
                           enabled=progress_wanted()) as step:
            failure = search(cluster, modes, examples=args.examples, seed=args.seed, tally=tally, step=step)
    except InvalidArgument as err:
        raise ConfigError(str(err)) from None
    names = [m if isinstance(m, str) else m.name for m in modes]
    breaks = affinity_breaks(cluster, modes) if failure is None else []
    if breaks:
        print(f"kproxy verify: {' and '.join(names)} disagree on sessionAffinity (families checked: "
              f"{families}); each line is one client:", file=sys.stdout)
        for found in breaks:
            print(f"  {found}")
        return 1
    if failure is not None:
        print(f"kproxy verify: {' and '.join(names)} disagree (families checked: {families}); "
              "the minimal packet:\n", file=sys.stdout)
        print(format_comparison(failure))
        return 1
    known = ", ".join(f"{k} x{v}" for k, v in sorted(tally.items()) if k != "packets")
    clients = len(affinity_clients(cluster))
    print(f"kproxy verify: {', '.join(names)} agree on {tally['packets']} packets "
          f"({len(cluster.snapshot)} service ports; families checked: {families}; seed {args.seed})"
          + (f"; known differences: {known}" if known else "")
          + (f"; sessionAffinity held for {clients} clients x {AFFINITY_CONNECTIONS} connections" if clients
             else ""))
    return 0
