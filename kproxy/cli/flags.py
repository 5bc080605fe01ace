"""The argparse side of the flags every command shares, and their hand-over to the run configuration.

Flags that feed :func:`kproxy.config.build_run_config` default to ``argparse.SUPPRESS``, so the
parsed namespace holds only the flags given on the command line (kube-proxy lets a flag given
win over ``--config``, and "given" must not be confused with "left at the default").
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from kproxy.config.flags import RUN_FLAGS
from kproxy.config.values import parse_bool
from kproxy.errors import ConfigError

__all__ = [
    "DURATION_FLAGS",
    "add_config_flag",
    "add_manifests_flag",
    "add_node_flags",
    "add_rule_flags",
    "given_flags",
    "join_negative_values",
    "warn",
    "warn_ignored",
]

_HIDE = argparse.SUPPRESS
#: Flags that take a Go duration; ``--flag -1s`` is joined to ``--flag=-1s`` before parsing.
DURATION_FLAGS = frozenset({"--min-sync-period", "--sync-period", "--udp-timeout", "--drain-timeout"})


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """``--min-sync-period -1s`` as ``--min-sync-period=-1s``, so the value reaches the duration check.

    argparse takes any word starting with ``-`` (other than a negative number) for an option, and
    would say "expected one argument"; kube-proxy's pflag takes the next word as the value.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        negative = nxt.startswith("-") and nxt[1:2] != "" and (nxt[1].isdigit() or nxt[1] == ".")
        if word in DURATION_FLAGS and negative:
            out.append(f"{word}={nxt}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def _bool(text: str) -> bool:
    try:
        return parse_bool(text, name="value")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}") from None


def add_manifests_flag(parser: argparse.ArgumentParser | Any, *, required: bool,
                       help_extra: str = "") -> None:
    """``--manifests PATH...`` with ``-f`` as its alias (kubectl's), ``-`` meaning standard input."""
    parser.add_argument("-f", "--manifests", nargs="+", metavar="PATH", default=_HIDE, required=required,
                        help="YAML or JSON files or folders with Services and EndpointSlices; - reads "
                             "standard input (kubectl get svc,endpointslices -A -o yaml | kproxy ... -f -)"
                             + help_extra)


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``: a KubeProxyConfiguration; flags given on the command line win over it."""
    parser.add_argument("--config", default=_HIDE, metavar="FILE",
                        help="a KubeProxyConfiguration file (kubeadm's config.conf); flags given on the "
                             "command line override it")


def add_node_flags(parser: argparse.ArgumentParser, *, node_ip_help: str = "") -> None:
    """The node flags, the same in every command."""
    node = parser.add_argument_group("node")
    node.add_argument("--hostname-override", default=_HIDE, metavar="NAME",
                      help="this node's name; endpoints with this nodeName are local (default: --config's "
                           "hostnameOverride, else $NODE_NAME, else the host name, lower case)")
    node.add_argument("--node-ip", action="append", default=_HIDE, metavar="IP",
                      help="a node IP (repeat for several, several per family allowed); the first of a "
                           "family is its primary IP" + node_ip_help)
    node.add_argument("--node-zone", default=_HIDE, metavar="ZONE",
                      help="this node's topology.kubernetes.io/zone label, for topology hints")
    node.add_argument("--ip-families", default=_HIDE, metavar="LIST",
                      help="the families proxied, primary first (default: those of the --node-ip "
                           "addresses, else IPv4,IPv6)")
    node.add_argument("--ip-family", default=_HIDE, choices=("IPv4", "IPv6"),
                      help="one family only: the same as --ip-families FAMILY")


def add_rule_flags(parser: argparse.ArgumentParser, *, modes: Sequence[str] | None, default_mode: str,
                   mode_help: str) -> None:
    """kube-proxy's flags that shape the rules; ``--proxy-mode`` with ``modes`` (from the registry)."""
    if modes is not None:
        parser.add_argument("--proxy-mode", default=_HIDE, choices=tuple(modes),
                            help=f"{mode_help} (default: --config's mode, else {default_mode})")
    ipt = parser.add_argument_group("rules (iptables and ipvs modes)")
    ipt.add_argument("--cluster-cidr", default=_HIDE, metavar="CIDR[,CIDR]",
                     help="pod CIDRs, one per family: traffic from outside them to a ClusterIP is "
                          "masqueraded")
    ipt.add_argument("--masquerade-all", action="store_true", default=_HIDE,
                     help="masquerade all traffic sent to ClusterIPs (default: --config's, else off)")
    ipt.add_argument("--nodeport-addresses", default=_HIDE, metavar="CIDR[,CIDR]|primary",
                     help="addresses NodePorts accept on: CIDRs (IP/32 for one address) or primary "
                          "(default: every local address)")
    ipt.add_argument("--iptables-masquerade-bit", type=int, default=_HIDE, metavar="BIT",
                     help="the fwmark bit that marks packets for masquerade, 0..31 (default: --config's, "
                          "else 14)")
    ipt.add_argument("--iptables-localhost-nodeports", type=_bool, default=_HIDE, metavar="BOOL",
                     help="accept NodePort connections to 127.0.0.1 (IPv4; default: --config's, else true)")
    ipt.add_argument("--ipvs-scheduler", default=_HIDE, metavar="NAME",
                     help="ipvs mode: the IPVS scheduler (rr, wrr, lc, wlc, sed, nq, fo, ovf, sh, dh, mh; "
                          "default: --config's ipvs.scheduler, else rr)")
    bpf = parser.add_argument_group("load balancing (ebpf mode; Cilium's flags)")
    bpf.add_argument("--bpf-lb-algorithm", default=_HIDE, metavar="random|maglev",
                     help="the backend selection of external traffic (default random); a Service's "
                          "service.cilium.io/lb-algorithm annotation overrides it")
    bpf.add_argument("--bpf-lb-maglev-table-size", type=int, default=_HIDE, metavar="M",
                     help="Maglev table size per service, one of 251, 509, 1021, 2039, 4093, 8191, "
                          "16381, 32749, 65521, 131071 (default 16381)")
    bpf.add_argument("--bpf-lb-maglev-hash-seed", default=_HIDE, metavar="BASE64",
                     help="cluster-wide Maglev seed, base64 of 12 bytes (default JLfvgnHc2kaSUFaI)")
    ipt.add_argument("--service-cidr", default=_HIDE, metavar="CIDR[,CIDR]",
                     help="nftables mode: the ranges ClusterIPs are allocated from (what kube-proxy "
                          "reads from ServiceCIDR objects); traffic to an unallocated ClusterIP in "
                          "them is dropped (default: none)")


def given_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The configuration flags present in ``args`` (those given), by their long name.

    Returns:
        ``{"--node-ip": ["192.168.0.2"], ...}`` for every flag of
        :data:`kproxy.config.flags.RUN_FLAGS` the namespace holds.
    """
    out: dict[str, Any] = {}
    for action in _actions(parser):
        longs = [s for s in action.option_strings if s.startswith("--")]
        if longs and longs[0] in RUN_FLAGS and hasattr(args, action.dest):
            out[longs[0]] = getattr(args, action.dest)
    return out


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return list(parser._actions)


def warn(message: str) -> None:
    """One ``kproxy: warning: MESSAGE`` line on stderr."""
    import sys

    print(f"kproxy: warning: {message}", file=sys.stderr)


def warn_ignored(given: Sequence[str], *, why: str, only: str | None = None) -> None:
    """Warn on stderr, in one line, that the flags ``given`` have no effect here (nothing if none).

    The line reads ``kproxy: warning: FLAGS only apply to ONLY; WHY`` when ``only`` is given,
    else ``kproxy: warning: FLAGS ignored: WHY``.
    """
    if not given:
        return
    names = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
    if only is not None:
        verb = "applies" if len(given) == 1 else "apply"
        warn(f"{names} only {verb} to {only}; {why}")
    else:
        warn(f"{names} ignored: {why}")


def flags_in(given: Mapping[str, Any] | frozenset[str], flags: Sequence[str]) -> list[str]:
    """The flags of ``flags`` that were given, in ``flags`` order."""
    return [flag for flag in flags if flag in given]
