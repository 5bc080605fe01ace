"""A node dump directory: writing one on a node (``kproxy node-dump``) and reading one back.

Theory of operation: the directory's layout is a contract, so a dump collected by hand works
too. Each file holds exactly what its tool prints; every file is optional except the rules
(``iptables-save.txt`` or ``ip6tables-save.txt`` for the packet's family):

========================  ================================================
``iptables-save.txt``     ``iptables-save -c``
``ip6tables-save.txt``    ``ip6tables-save -c``
``nft-ruleset.txt``       ``nft list ruleset`` (only when ``nft`` is present)
``ipset-save.txt``        ``ipset save``
``ip-addr.json``          ``ip -j addr show``
``ip-route.json``         ``ip -j route show table all``
``ip6-route.json``        ``ip -6 -j route show table all``
``ip-link.json``          ``ip -j link show``
``sysctl.txt``            ``sysctl`` of the names in :data:`SYSCTLS` (``name = value``)
``xt_recent/NAME``        ``/proc/net/xt_recent/NAME``, one file per list
========================  ================================================

:func:`write_node_dump` is the thin I/O shell that runs the tools in the current network
namespace; :func:`read_node_dump` reads a directory (or single files given one by one) into an
emulation :class:`~emulation.node.Node` and the ``recent`` lists, with
:mod:`emulation.nodedump`'s pure readers.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from emulation import ManualClock, Node, Packet
from emulation.errors import InputError
from emulation.netfilter import Netns
from emulation.netfilter.context import RecentEntry
from emulation.nodedump import node_from_dump, parse_xt_recent
from kproxy.errors import ConfigError, KernelError
from kproxy.trace.detail import arrival_interface

__all__ = [
    "DUMP_FILES",
    "ONE_INTERFACE_NOTE",
    "SYSCTLS",
    "NodeDump",
    "dump_netns",
    "load_recent",
    "read_node_dump",
    "write_node_dump",
]

#: File name -> the command whose standard output it holds.
DUMP_FILES: Mapping[str, tuple[str, ...]] = {
    "iptables-save.txt": ("iptables-save", "-c"),
    "ip6tables-save.txt": ("ip6tables-save", "-c"),
    "nft-ruleset.txt": ("nft", "list", "ruleset"),
    "ipset-save.txt": ("ipset", "save"),
    "ip-addr.json": ("ip", "-j", "addr", "show"),
    "ip-route.json": ("ip", "-j", "route", "show", "table", "all"),
    "ip6-route.json": ("ip", "-6", "-j", "route", "show", "table", "all"),
    "ip-link.json": ("ip", "-j", "link", "show"),
}
#: The sysctls the data path reads (``sysctl.txt``); a name the kernel lacks is left out.
SYSCTLS = ("net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding", "net.ipv4.conf.all.route_localnet",
           "net.ipv4.conf.all.rp_filter", "net.bridge.bridge-nf-call-iptables",
           "net.bridge.bridge-nf-call-ip6tables", "net.netfilter.nf_conntrack_tcp_loose")
_RECENT = Path("/proc/net/xt_recent")
#: What a trace without a node dump says about the node it assumed.
ONE_INTERFACE_NOTE = ("no node dump: the node is modelled as one interface eth0 carrying the node IPs with "
                      "default routes out of it (give --node-dump DIR, or --ip-addr/--ip-route/--ip-link, "
                      "for the node's own interfaces, routes and bridges); recent lists are assumed empty")


def write_node_dump(out: Path, *, proc_sys: Path = Path("/proc/sys"), recent_dir: Path = _RECENT,
                    timeout: float = 60.0) -> list[str]:
    """Run the tools of :data:`DUMP_FILES` in the current network namespace and write ``out``.

    A tool that is not installed is skipped (its file is absent); sysctls are read from
    ``proc_sys`` and xt_recent lists copied from ``recent_dir``.

    Returns:
        The names of the files written, in order.

    Raises:
        KernelError: a tool failed (exit status and its stderr), or timed out after ``timeout`` seconds.
        ConfigError: ``out`` cannot be created.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {out}: {err.strerror or err}") from None
    written = []
    for name, argv in DUMP_FILES.items():
        if shutil.which(argv[0]) is None:
            continue
        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise KernelError(f"{' '.join(argv)} did not finish in {timeout:g}s") from None
        if done.returncode != 0:
            if argv[0] in ("ip6tables-save", "ipset", "nft"):  # an absent family or module is no dump error
                continue
            raise KernelError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode().strip()}")
        (out / name).write_bytes(done.stdout)
        written.append(name)
    lines = []
    for key in SYSCTLS:
        try:
            value = (proc_sys / key.replace(".", "/")).read_text().strip()
        except OSError:
            continue
        lines.append(f"{key} = {value}\n")
    (out / "sysctl.txt").write_text("".join(lines))
    written.append("sysctl.txt")
    if recent_dir.is_dir():
        (out / "xt_recent").mkdir(exist_ok=True)
        for lst in sorted(recent_dir.iterdir()):
            (out / "xt_recent" / lst.name).write_text(lst.read_text())
            written.append(f"xt_recent/{lst.name}")
    return written


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeDump:
    """A node dump read back: the ``node``, the rules file of each family (path or ``None``), the
    ``recent`` lists' texts by name (``None``: the dump has no xt_recent directory) and ``notes``
    on what was assumed."""

    node: Node
    rules: Mapping[int, Path | None]
    recent: Mapping[str, str] | None
    notes: tuple[str, ...]


def _read(path: Path | None, flag: str) -> str | None:
    if path is None or not path.exists():
        return None
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{flag}: cannot read {str(path)!r}: {err}") from None


def read_node_dump(directory: str | None, *, ip_addr: str | None = None, ip_route: str | None = None,
                   ip_link: str | None = None, defaults: Node) -> NodeDump:
    """Read ``--node-dump DIR`` and the single files ``--ip-addr``, ``--ip-route``, ``--ip-link``
    (a single file wins over the directory's); ``defaults`` stands in for what is missing.

    Raises:
        ConfigError: a file cannot be read or does not parse (naming it), or ``DIR`` is not a directory.
    """
    base = Path(directory) if directory else None
    if base is not None and not base.is_dir():
        raise ConfigError(f"--node-dump {directory}: not a directory (see `kproxy node-dump --out DIR`)")

    def pick(single: str | None, name: str, flag: str) -> str | None:
        if single is not None:
            text = _read(Path(single), flag)
            if text is None:
                raise ConfigError(f"{flag}: {single!r} does not exist")
            return text
        return _read(base / name, f"--node-dump {directory}") if base else None

    texts = {"ip_addr": pick(ip_addr, "ip-addr.json", "--ip-addr"),
             "ip_route": pick(ip_route, "ip-route.json", "--ip-route"),
             "ip6_route": _read(base / "ip6-route.json", f"--node-dump {directory}") if base else None,
             "ip_link": pick(ip_link, "ip-link.json", "--ip-link"),
             "sysctl": _read(base / "sysctl.txt", f"--node-dump {directory}") if base else None}
    try:
        node = node_from_dump(defaults=defaults, **texts)
    except InputError as err:
        raise ConfigError(f"node dump: {err}") from None
    notes = []
    if texts["ip_addr"] is None:
        notes.append("no ip-addr.json: the node is modelled as one interface eth0 with the node IPs")
    recent: dict[str, str] | None = None
    if base is not None and (base / "xt_recent").is_dir():
        recent = {p.name: p.read_text() for p in sorted((base / "xt_recent").iterdir())}
    rules = {4: base / "iptables-save.txt", 6: base / "ip6tables-save.txt"} if base else {}
    return NodeDump(node=node, rules={v: p if p.exists() else None for v, p in rules.items()},
                    recent=recent, notes=tuple(notes))


def load_recent(netns: Netns, recent: Mapping[str, str], version: int) -> int:
    """Put the dump's ``recent`` lists into ``netns`` (entries of ``version``), every entry taken
    as hit at the dump's moment (now on the emulated clock: the dump has no jiffies reference,
    so ages are not known) as many times as it has stamps. Returns the entries loaded.

    Raises:
        ConfigError: a list does not parse (naming it).
    """
    now = netns.clock.now()
    count = 0
    for name, text in recent.items():
        try:
            lines = parse_xt_recent(text, name=f"xt_recent/{name}")
        except InputError as err:
            raise ConfigError(f"node dump: {err}") from None
        table = netns.dynamic.recent.setdefault(name, {})
        for line in lines:
            if line.version == version:
                table[(line.version, line.value)] = RecentEntry(stamps=tuple(now for _ in line.stamps))
                count += 1
    return count


def dump_netns(netns: Netns, dump: NodeDump, packet: Packet,
               in_interface: str | None) -> tuple[Netns, Packet, tuple[str, ...]]:
    """``netns``'s rules on the dump's node, with its ``recent`` lists, and ``packet`` arriving on
    :func:`~kproxy.trace.detail.arrival_interface`; plus the notes the trace carries.

    Raises:
        ConfigError: a bad ``in_interface``, no route back to the source, or a list that does not parse.
    """
    node_netns = Netns(dump.node, ManualClock(), ruleset=netns.ruleset)
    notes = list(dump.notes)
    if dump.recent is None:
        notes.append("the dump has no xt_recent lists: recent lists (ClientIP affinity) are assumed empty")
    else:
        loaded = load_recent(node_netns, dump.recent, packet.version)
        notes.append(f"recent lists from the dump: {loaded} entr{'y' if loaded == 1 else 'ies'} in "
                     f"{len(dump.recent)} list(s), each taken as hit at the dump's moment")
    iif = arrival_interface(dump.node, packet.src, in_interface)
    return node_netns, replace(packet, in_interface=iif), tuple(notes)
