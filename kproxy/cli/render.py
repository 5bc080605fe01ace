"""``kproxy render``: print what the iptables mode would load, as ``iptables-restore`` input.

Also the flags ``render`` and ``trace`` share (the cluster, the node and kube-proxy's iptables
settings) and their conversion into a Snapshot and an
:class:`~kproxy.modes.iptables.IptablesConfig`. No logic beyond that: the renderer does the work.
ipvs-only flags given to the iptables mode are accepted and ignored, as kube-proxy does, with one
warning line on stderr naming them.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kproxy.config.kubeproxy import nodeport_addresses_flag
from kproxy.errors import ConfigError
from kproxy.model import EndpointSlice, IPFamily, NodeConfig, Service, Snapshot, build_snapshot
from kproxy.modes.iptables import IptablesConfig, render_full
from kproxy.modes.ipvs import DEFAULT_SCHEDULER, IpvsConfig

#: How ``render --proxy-mode ipvs`` heads each of its three sections (``# ==> TITLE``).
IPVS_SECTION_PREFIX = "# ==> "

if TYPE_CHECKING:
    from kproxy.daemon import UserspaceOptions
    from kproxy.daemon.kernel import KernelRunOptions

__all__ = [
    "IPVS_SECTION_PREFIX",
    "add_cluster_flags",
    "add_parser",
    "config_from_args",
    "family_of_args",
    "flags_given",
    "ipvs_config_from_args",
    "ipvs_only_flags_given",
    "kernel_run_options",
    "nodeport_addresses",
    "run",
    "snapshot_from_args",
    "warn_ignored_flags",
    "warn_unused_ipvs_flags",
]


def add_cluster_flags(parser: argparse.ArgumentParser, *, manifests_required: bool) -> None:
    """The flags describing the cluster, the node and the iptables settings."""
    parser.add_argument("--manifests", nargs="+", metavar="PATH", required=manifests_required,
                        help="YAML or JSON files or folders with Services and EndpointSlices")
    parser.add_argument("--proxy-mode", default="iptables", choices=("iptables", "ipvs"),
                        help="the proxy mode rendered (iptables or ipvs)")
    node = parser.add_argument_group("node")
    node.add_argument("--hostname-override", default=None, metavar="NAME",
                      help="this node's name; endpoints with this nodeName are local (default: host name)")
    node.add_argument("--node-ip", action="append", default=[], metavar="IP",
                      help="a node IP (repeat for several); the first of a family is its primary IP")
    node.add_argument("--ip-family", default=None, choices=("IPv4", "IPv6"),
                      help="the family rendered (default: that of the first --node-ip, else IPv4)")
    ipt = parser.add_argument_group("iptables")
    ipt.add_argument("--cluster-cidr", default=None, metavar="CIDR[,CIDR]",
                     help="pod CIDRs: traffic from outside them to a ClusterIP is masqueraded")
    ipt.add_argument("--masquerade-all", action="store_true",
                     help="masquerade all traffic to ClusterIPs")
    ipt.add_argument("--nodeport-addresses", default=None, metavar="CIDR[,CIDR]|primary",
                     help="addresses NodePorts answer on: CIDRs (IP/32 for one address) or primary "
                          "(default: every local address)")
    ipt.add_argument("--iptables-masquerade-bit", type=int, default=None, metavar="BIT",
                     help="the fwmark bit marking packets for SNAT (default 14: 0x00004000)")
    ipvs = parser.add_argument_group("ipvs mode (ignored with a warning in iptables mode)")
    ipvs.add_argument("--ipvs-scheduler", default=None, metavar="NAME",
                      help="the IPVS scheduler (rr, wrr, lc, wlc, sed, nq, fo, ovf, sh, dh, mh; default rr)")


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip()) if text else ()


def nodeport_addresses(text: str | None) -> tuple[str, ...]:
    """``--nodeport-addresses``: CIDRs, or ``primary`` alone, split and checked as kube-proxy does.

    Returns:
        The canonical values; ``()`` when the flag is absent or ``""`` (every local address).

    Raises:
        ConfigError: naming the flag and the bad value (a bare IP is not taken as ``/32``; blanks
            and empty elements are kept, as pflag keeps them, so they are errors too).
    """
    return () if text is None else nodeport_addresses_flag(text)


#: Flags only the ipvs mode uses: (flag, attribute). The iptables group's flags are all used by
#: the ipvs mode too (kube-proxy's ipvs proxier masquerades with the same mark and detector).
_IPVS_ONLY = (("--ipvs-scheduler", "ipvs_scheduler"), ("--connections", "connections"))


def ipvs_only_flags_given(args: argparse.Namespace) -> list[str]:
    """The ipvs-only flags given on the command line (their parser default is None)."""
    return [flag for flag, attr in _IPVS_ONLY if getattr(args, attr, None) is not None]


def warn_unused_ipvs_flags(args: argparse.Namespace) -> None:
    """Warn on stderr, in one line, about ipvs-only flags given to the iptables mode.

    kube-proxy accepts and ignores them too, so this is a warning, never an error.
    """
    warn_ignored_flags(ipvs_only_flags_given(args), only="--proxy-mode ipvs", why="ignored in iptables mode")


def warn_ignored_flags(given: Sequence[str], *, why: str, only: str | None = None) -> None:
    """Warn on stderr, in one line, that the flags ``given`` have no effect here (nothing if none).

    The line reads ``kproxy: warning: FLAGS only apply to ONLY; WHY`` when ``only`` is given,
    else ``kproxy: warning: FLAGS ignored: WHY``.
    """
    if not given:
        return
    names = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
    if only is not None:
        verb = "applies" if len(given) == 1 else "apply"
        print(f"kproxy: warning: {names} only {verb} to {only}; {why}", file=sys.stderr)
    else:
        print(f"kproxy: warning: {names} ignored: {why}", file=sys.stderr)


def flags_given(args: argparse.Namespace, flags: Sequence[tuple[str, str]]) -> list[str]:
    """The flags of ``flags`` ((flag, attribute) pairs) given: their value is not None, False or []."""
    return [flag for flag, attr in flags if getattr(args, attr, None) not in (None, False, [])]


#: Configuration fields and the flags that set them, for error messages.
_FLAGS = {"masquerade_bit": "--iptables-masquerade-bit", "cluster_cidr": "--cluster-cidr",
          "nodeport_addresses": "--nodeport-addresses", "node_ips": "--node-ip"}


def _cluster_cidrs(text: str | None) -> tuple[str, ...]:
    """``--cluster-cidr``: CIDRs, at most one per IP family (as kube-proxy)."""
    cidrs = _csv(text)
    seen: dict[int, str] = {}
    for cidr in cidrs:
        try:
            version = ipaddress.ip_network(cidr, strict=False).version
        except ValueError:
            raise ConfigError(f"--cluster-cidr: expected a CIDR such as 10.0.0.0/8, got {cidr!r}") from None
        if version in seen:
            raise ConfigError(f"--cluster-cidr: at most one CIDR per IP family (one IPv4 and one IPv6), "
                              f"got {seen[version]!r} and {cidr!r}")
        seen[version] = cidr
    return cidrs


def _iptables_config(**fields: object) -> IptablesConfig:
    """IptablesConfig(**fields), its errors naming flags rather than fields."""
    bit = fields.get("masquerade_bit")
    if isinstance(bit, int) and not 0 <= bit <= 31:
        raise ConfigError(f"--iptables-masquerade-bit: expected 0..31, got {bit}")
    try:
        return IptablesConfig(**fields)  # type: ignore[arg-type]
    except ConfigError as err:
        message = str(err)
        for field_name, flag in _FLAGS.items():
            if message.startswith(f"{field_name}:"):
                message = flag + message[len(field_name):]
        raise ConfigError(message) from None


def config_from_args(args: argparse.Namespace, family: IPFamily) -> IptablesConfig:
    """The iptables settings the flags describe, for ``family``.

    Raises:
        ConfigError: a malformed IP or CIDR, more than one ``--cluster-cidr`` of a family, a
            masquerade bit out of 0..31 (the message names the flag).
    """
    for ip in args.node_ip:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(f"--node-ip: expected an IP address, got {ip!r}") from None
    return _iptables_config(
        family=family,
        node_ips=tuple(args.node_ip),
        cluster_cidr=_cluster_cidrs(args.cluster_cidr),
        masquerade_all=bool(args.masquerade_all),
        masquerade_bit=14 if args.iptables_masquerade_bit is None else args.iptables_masquerade_bit,
        nodeport_addresses=nodeport_addresses(args.nodeport_addresses),
    )


def ipvs_config_from_args(args: argparse.Namespace, family: IPFamily) -> IpvsConfig:
    """The ipvs mode's settings the flags describe, for ``family``.

    Raises:
        ConfigError: a malformed IP or CIDR, or an unknown scheduler.
    """
    base = config_from_args(args, family)
    return IpvsConfig(family=family, node_ips=base.node_ips, cluster_cidr=base.cluster_cidr,
                      masquerade_all=base.masquerade_all, masquerade_bit=base.masquerade_bit,
                      nodeport_addresses=base.nodeport_addresses,
                      scheduler=args.ipvs_scheduler or DEFAULT_SCHEDULER)


def family_of_args(args: argparse.Namespace) -> IPFamily:
    """``--ip-family``, else the family of the first ``--node-ip``, else IPv4."""
    if args.ip_family:
        return IPFamily(args.ip_family)
    if args.node_ip and ":" in args.node_ip[0]:
        return IPFamily.IPv6
    return IPFamily.IPv4


def snapshot_from_args(args: argparse.Namespace) -> Snapshot:
    """Read ``--manifests`` once and build this node's Snapshot; problems are warnings on stderr.

    Raises:
        ConfigError: a ``--manifests`` path does not exist (a usage error).
    """
    from pathlib import Path

    from kproxy.sources.manifests import load_manifests

    for path in args.manifests:
        if not Path(path).exists():
            raise ConfigError(f"--manifests: {path!r} does not exist; expected a file or a folder")
    objects, problems = load_manifests(args.manifests)
    for problem in problems:
        print(f"kproxy: warning: {problem}", file=sys.stderr)
    hostname = (args.hostname_override or socket.gethostname()).strip().lower()
    services = [o for o in objects if isinstance(o, Service)]
    slices = [o for o in objects if isinstance(o, EndpointSlice)]
    return build_snapshot(services, slices, NodeConfig(hostname=hostname))


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``render`` on the ``kproxy`` subparsers."""
    parser = sub.add_parser(
        "render", help="print the rules a proxy mode would load",
        description="Print the iptables-restore input kube-proxy's iptables mode would load for "
                    "these manifests on this node (a full sync; load it with "
                    "iptables-restore --noflush, after the jump rules). With --proxy-mode ipvs, print "
                    "three sections headed '# ==> TITLE': the ipvsadm-save -n text, the ipset save "
                    "text and the iptables-restore input.")
    add_cluster_flags(parser, manifests_required=True)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """``kproxy render``: write the restore input to stdout; exit status 0.

    Raises:
        ConfigError: a bad flag value.
        SourceError: a manifest path does not exist.
    """
    family = family_of_args(args)
    if args.proxy_mode == "ipvs":
        from kproxy.modes.ipvs import render

        out = render(snapshot_from_args(args), ipvs_config_from_args(args, family))
        sys.stdout.write("".join(f"{IPVS_SECTION_PREFIX}{title}\n{text}" for title, text in (
            ("ipvsadm-save -n", out.ipvsadm), ("ipset save", out.ipsets),
            ("iptables-restore", out.iptables))))
        return 0
    warn_unused_ipvs_flags(args)
    config = config_from_args(args, family)
    sys.stdout.write(render_full(snapshot_from_args(args), config))
    return 0


def kernel_run_options(args: argparse.Namespace, options: UserspaceOptions) -> KernelRunOptions:
    """``kproxy run --proxy-mode iptables|ipvs``'s settings from its flags and the userspace options.

    The iptables flags (``--node-ip``, ``--cluster-cidr``, ``--masquerade-all``,
    ``--nodeport-addresses``, ``--iptables-masquerade-bit``) are read when ``run`` has them, and
    ``--ipvs-scheduler`` in ipvs mode.

    Raises:
        ConfigError: a bad value.
    """
    from kproxy.daemon.kernel import KernelRunOptions

    config = _iptables_config(
        node_ips=tuple(getattr(args, "node_ip", None) or ()),
        cluster_cidr=_cluster_cidrs(getattr(args, "cluster_cidr", None)),
        masquerade_all=bool(getattr(args, "masquerade_all", False)),
        masquerade_bit=14 if getattr(args, "iptables_masquerade_bit", None) is None
        else args.iptables_masquerade_bit,
        nodeport_addresses=nodeport_addresses(getattr(args, "nodeport_addresses", None)),
    )
    ipvs = None
    if args.proxy_mode == "ipvs":
        ipvs = IpvsConfig(family=config.family, node_ips=config.node_ips, cluster_cidr=config.cluster_cidr,
                          masquerade_all=config.masquerade_all, masquerade_bit=config.masquerade_bit,
                          nodeport_addresses=config.nodeport_addresses,
                          scheduler=getattr(args, "ipvs_scheduler", None) or DEFAULT_SCHEDULER)
    return KernelRunOptions(mode=args.proxy_mode, iptables=config, ipvs=ipvs, kernel=args.kernel,
                            min_sync_period_s=options.min_sync_period_s, sync_period_s=options.sync_period_s)
