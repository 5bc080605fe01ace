"""``kproxy render``: print what the iptables or ipvs mode would load, in the kernel's own formats.

Parsing and printing only: the manifests are read by :mod:`kproxy.trace.build`, the rules
rendered by the mode from the run configuration (``IptablesConfig.from_run``,
``IpvsConfig.from_run``). ipvs-only flags given to the iptables mode are accepted and ignored,
as kube-proxy does, with one warning line on stderr naming them.
"""

from __future__ import annotations

import argparse
import json
import sys

from kproxy.cli.flags import (
    add_config_flag,
    add_manifests_flag,
    add_node_flags,
    add_rule_flags,
    flags_in,
    given_flags,
    warn,
    warn_ignored,
)
from kproxy.cli.progress import document_progress, progress_wanted
from kproxy.config import Command, RunConfig, build_run_config
from kproxy.config.defaults import DEFAULT_RENDER_MODE
from kproxy.config.flags import EBPF_ONLY_FLAGS, IPVS_ONLY_FLAGS, NFTABLES_ONLY_FLAGS
from kproxy.modes import rendered_modes
from kproxy.modes.ebpf import EbpfConfig, render_maps, to_document, to_table
from kproxy.modes.iptables import IptablesConfig, render_full
from kproxy.modes.ipvs import IpvsConfig
from kproxy.modes.ipvs import render as render_ipvs
from kproxy.modes.nftables import NftablesConfig, render_transaction
from kproxy.trace.build import Manifests, read_manifests, snapshot_of

__all__ = ["IPVS_SECTION_PREFIX", "add_parser", "config_of", "print_problems", "run"]

#: How ``render --proxy-mode ipvs`` heads each of its three sections (``# ==> TITLE``).
IPVS_SECTION_PREFIX = "# ==> "


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``render`` on the ``kproxy`` subparsers."""
    parser = sub.add_parser(
        "render", help="print the rules a proxy mode would load",
        description="Print the iptables-restore input kube-proxy's iptables mode would load for "
                    "these manifests on this node (a full sync of the primary family; load it with "
                    "iptables-restore --noflush, after the jump rules). With --proxy-mode ipvs, print "
                    "three sections headed '# ==> TITLE': the ipvsadm-save -n text, the ipset save "
                    "text and the iptables-restore input. With --proxy-mode ebpf, print Cilium's service "
                    "maps as cilium-dbg bpf lb list does, or with --json a stable document (see README).")
    add_manifests_flag(parser, required=True)
    add_config_flag(parser)
    add_rule_flags(parser, modes=rendered_modes(), default_mode=DEFAULT_RENDER_MODE,
                   mode_help="the proxy mode rendered")
    add_node_flags(parser)
    parser.add_argument("--json", action="store_true",
                        help="ebpf mode: print the maps as the JSON document of the README")
    parser.set_defaults(handler=run, subparser=parser)


def config_of(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Command) -> RunConfig:
    """The configuration of ``render`` or ``trace`` from its parsed flags and ``--config``.

    Raises:
        ConfigError: a bad value, naming the flag or the file and field.
    """
    return build_run_config(given_flags(args, parser), command=command, modes=rendered_modes(),
                            default_mode=DEFAULT_RENDER_MODE)


def print_problems(manifests: Manifests) -> None:
    """Each problem found in the manifests as a warning line on stderr."""
    for problem in manifests.problems:
        warn(str(problem))


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``kproxy render``: write the programme to stdout; exit status 0.

    Raises:
        ConfigError: a bad flag value, or a manifest path that does not exist.
    """
    config = config_of(args, parser, Command.RENDER)
    with document_progress(enabled=progress_wanted()) as report:
        manifests = read_manifests(config.source.manifests, progress=report)
    print_problems(manifests)
    snapshot = snapshot_of(config, manifests)
    if config.proxy_mode == "ebpf":
        warn_ignored(flags_in(config.given, IPVS_ONLY_FLAGS), only="--proxy-mode ipvs",
                     why="ignored in ebpf mode")
        maps = render_maps(snapshot, EbpfConfig.from_run(config))
        if getattr(args, "json", False):
            sys.stdout.write(json.dumps(to_document(maps), indent=2) + "\n")
        else:
            sys.stdout.write(to_table(maps))
        return 0
    if getattr(args, "json", False):
        warn("--json: only --proxy-mode ebpf prints JSON; ignored")
    warn_ignored(flags_in(config.given, EBPF_ONLY_FLAGS), only="--proxy-mode ebpf",
                 why=f"ignored in {config.proxy_mode} mode")
    if config.proxy_mode == "ipvs":
        out = render_ipvs(snapshot, IpvsConfig.from_run(config))
        sys.stdout.write("".join(f"{IPVS_SECTION_PREFIX}{title}\n{text}" for title, text in (
            ("ipvsadm-save -n", out.ipvsadm), ("ipset save", out.ipsets),
            ("iptables-restore", out.iptables))))
        return 0
    warn_ignored(flags_in(config.given, IPVS_ONLY_FLAGS), only="--proxy-mode ipvs",
                 why=f"ignored in {config.proxy_mode} mode")
    if config.proxy_mode == "nftables":
        ipt = IptablesConfig.from_run(config)
        nft = NftablesConfig.from_run(family=ipt.family, node_ips=ipt.node_ips, cluster_cidr=ipt.cluster_cidr,
                                      masquerade_all=ipt.masquerade_all, masquerade_bit=ipt.masquerade_bit,
                                      nodeport_addresses=ipt.nodeport_addresses,
                                      service_cidr=config.rules.service_cidrs)
        sys.stdout.write(render_transaction(snapshot, nft))
        return 0
    warn_ignored(flags_in(config.given, NFTABLES_ONLY_FLAGS), only="--proxy-mode nftables",
                 why=f"ignored in {config.proxy_mode} mode")
    sys.stdout.write(render_full(snapshot, IptablesConfig.from_run(config)))
    return 0
