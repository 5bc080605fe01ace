"""Reading ``ipvsadm-save -n`` rules and ``ipvsadm -Ln [--nosort]`` listings into a table.

:func:`load_rules` replays rules as ``ipvsadm-restore`` does, one command after the other, so
every ``-a`` lands at the head of its list (a sorted save is loaded in reverse sorted order, as
on a real node). :func:`load_list` reads a listing; with ``nosort=True`` the rows are the
kernel's order and are added bottom-up so that the first row ends up at the head. A listed
weight-0 server is added at weight 0 (for ``mh`` it then holds no table slot: a dump carries
no history). Listed connection counts are kept as the servers' counters.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from emulation.ipvs.errors import IpvsError
from emulation.ipvs.model import (
    DEFAULT_PERSISTENCE_S,
    SVC_F_ONEPACKET,
    SVC_F_PERSISTENT,
    DestSpec,
    Forward,
    Proto,
    ServiceKey,
    ServiceSpec,
    parse_address,
)
from emulation.ipvs.sysctl import Sysctls
from emulation.ipvs.table import IpvsTable
from emulation.ipvs.text import GENERIC_FLAGS, SCHED_FLAG_NAMES

__all__ = ["load_list", "load_rules"]

_NAME_FWD: dict[str, Forward] = {"masq": "masq", "route": "route", "tunnel": "tunnel", "local": "local"}
_PROTO_OPT: dict[str, Proto] = {
    "-t": "tcp",
    "--tcp-service": "tcp",
    "-u": "udp",
    "--udp-service": "udp",
    "--sctp-service": "sctp",
}
_FWD_OPT: dict[str, Forward] = {
    "-m": "masq",
    "--masquerading": "masq",
    "-g": "route",
    "--gatewaying": "route",
    "-i": "tunnel",
    "--ipip": "tunnel",
}


def _split_hostport(text: str, *, default_port: int | None) -> tuple[tuple[int, int], int]:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise IpvsError(f"unclosed bracket in {text!r}")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    addr = parse_address(host)
    if not port_text:
        if default_port is None:
            raise IpvsError(f"{text!r} needs a port")
        return addr, default_port
    if not port_text.isdigit() or int(port_text) > 65535:
        raise IpvsError(f"invalid port in {text!r}; ipvsadm -n output is numeric")
    return addr, int(port_text)


def _netmask(version: int, text: str) -> int:
    if version == 4:
        if text.isdigit():
            plen = int(text)
            return (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
        v, value = parse_address(text)
        if v != 4:
            raise IpvsError(f"netmask {text!r} is not IPv4")
        return value
    if not text.isdigit():
        raise IpvsError(f"IPv6 netmask {text!r} must be a prefix length")
    return int(text)


def _flags_from_names(scheduler: str, text: str) -> int:
    known = dict((name, bit) for bit, name in SCHED_FLAG_NAMES.get(scheduler, ()))
    known.update((name, bit) for bit, name in GENERIC_FLAGS)
    bits = 0
    for name in text.split(","):
        if name not in known:
            raise IpvsError(f"scheduler flag {name!r} is not valid for {scheduler}; expected {sorted(known)}")
        bits |= known[name]
    return bits


class _Rule:
    """One parsed ``ipvsadm`` command line."""

    def __init__(self, words: list[str]) -> None:
        self.command = ""
        self.key: ServiceKey | None = None
        self.scheduler = "wlc"
        self.flag_names = ""
        self.persistent: int | None = None
        self.netmask_text = ""
        self.onepacket = False
        self.real = ""
        self.forward: Forward = "route"
        self.weight = 1
        self.u = self.l = 0
        self._parse(words)

    def _parse(self, words: list[str]) -> None:
        commands = {"-A": "A", "--add-service": "A", "-E": "E", "--edit-service": "E", "-D": "D",
                    "--delete-service": "D", "-a": "a", "--add-server": "a", "-e": "e", "--edit-server": "e",
                    "-d": "d", "--delete-server": "d", "-C": "C", "--clear": "C"}  # fmt: skip
        it = iter(range(len(words)))
        six = "-6" in words or "--ipv6" in words
        for i in it:
            w = words[i]

            def value(i: int = i, w: str = w) -> str:
                if i + 1 >= len(words):
                    raise IpvsError(f"option {w} needs a value")
                next(it)
                return words[i + 1]

            if w in commands:
                if self.command:
                    raise IpvsError(f"two commands in one line: {w}")
                self.command = commands[w]
            elif w in _PROTO_OPT:
                addr, port = _split_hostport(value(), default_port=0)
                self.key = ServiceKey(addr[0], _PROTO_OPT[w], addr[1], port)
            elif w in ("-f", "--fwmark-service"):
                mark = value()
                if not mark.isdigit() or int(mark) == 0:
                    raise IpvsError(f"invalid fwmark {mark!r}")
                self.key = ServiceKey(6 if six else 4, "tcp", 0, 0, int(mark))
            elif w in ("-s", "--scheduler"):
                self.scheduler = value()
            elif w in ("-b", "--sched-flags"):
                self.flag_names = value()
            elif w in ("-p", "--persistent"):
                nxt = words[i + 1] if i + 1 < len(words) else ""
                if nxt.isdigit():
                    next(it)
                    self.persistent = int(nxt)
                else:
                    self.persistent = DEFAULT_PERSISTENCE_S
            elif w in ("-M", "--netmask"):
                self.netmask_text = value()
            elif w in ("-o", "--ops"):
                self.onepacket = True
            elif w in ("-r", "--real-server"):
                self.real = value()
            elif w in _FWD_OPT:
                self.forward = _FWD_OPT[w]
            elif w in ("-w", "--weight", "-x", "--u-threshold", "-y", "--l-threshold"):
                v = value()
                if not v.isdigit():
                    raise IpvsError(f"{w} takes a non-negative integer, got {v!r}")
                if w in ("-w", "--weight"):
                    self.weight = int(v)
                elif w in ("-x", "--u-threshold"):
                    self.u = int(v)
                else:
                    self.l = int(v)
            elif w in ("-6", "--ipv6", "-n", "--numeric"):
                continue
            else:
                raise IpvsError(f"unknown or unmodelled ipvsadm option {w!r}")
        if not self.command:
            raise IpvsError("no command (-A, -E, -D, -a, -e, -d or -C)")
        if self.command != "C" and self.key is None:
            raise IpvsError("no service given (-t, -u, --sctp-service or -f)")

    def service_spec(self) -> ServiceSpec:
        assert self.key is not None
        flags = _flags_from_names(self.scheduler, self.flag_names) if self.flag_names else 0
        if self.persistent is not None:
            flags |= SVC_F_PERSISTENT
        if self.onepacket:
            flags |= SVC_F_ONEPACKET
        netmask = _netmask(self.key.version, self.netmask_text) if self.netmask_text else None
        return ServiceSpec(
            key=self.key,
            scheduler=self.scheduler,
            flags=flags,
            timeout_s=self.persistent or 0,
            netmask=netmask,
        )

    def dest_spec(self) -> DestSpec:
        assert self.key is not None
        if not self.real:
            raise IpvsError("no real server given (-r)")
        addr, port = _split_hostport(self.real, default_port=self.key.port)
        return DestSpec(addr=addr, port=port, weight=self.weight, forward=self.forward,
                        u_threshold=self.u, l_threshold=self.l)  # fmt: skip


def _apply(table: IpvsTable, rule: _Rule, now: float) -> None:
    c = rule.command
    if c == "C":
        table.clear()
        return
    assert rule.key is not None
    if c == "A":
        table.add_service(rule.service_spec())
    elif c == "E":
        table.edit_service(rule.service_spec())
    elif c == "D":
        table.del_service(rule.key, now)
    elif c == "a":
        table.add_dest(rule.key, rule.dest_spec())
    elif c == "e":
        table.edit_dest(rule.key, rule.dest_spec())
    else:
        table.del_dest(rule.key, rule.dest_spec().key, now)


def _lines(text: str) -> Iterable[tuple[int, str]]:
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield n, line


def load_rules(
    text: str, table: IpvsTable | None = None, *, now: float = 0.0, sysctls: Sysctls | None = None
) -> IpvsTable:
    """Replay ``ipvsadm-save -n`` output (or any ``ipvsadm`` command lines) as ``ipvsadm-restore``.

    Args:
        text: one command per line (``-A``, ``-E``, ``-D``, ``-a``, ``-e``, ``-d``, ``-C``);
            blank lines and ``#`` comments are skipped; a leading ``ipvsadm`` word is allowed.
        table: the table to change (a new one if ``None``).
        now: the time of the changes, in seconds.
        sysctls: settings for a new table.

    Raises:
        IpvsError: naming the line, for syntax the model does not know or a refused command.
    """
    table = table if table is not None else IpvsTable(sysctls)
    for n, line in _lines(text):
        try:
            words = shlex.split(line)
            if words and words[0] in ("ipvsadm", "/sbin/ipvsadm", "/usr/sbin/ipvsadm"):
                words = words[1:]
            _apply(table, _Rule(words), now)
        except IpvsError as e:
            raise IpvsError(str(e), line=n, text=line) from None
        except ValueError as e:
            raise IpvsError(str(e), line=n, text=line) from None
    return table


def _parse_service_line(words: list[str]) -> ServiceSpec:
    if words[0] == "FWM":
        version = 6 if "IPv6" in words else 4
        key = ServiceKey(version, "tcp", 0, 0, int(words[1]))
        rest = [w for w in words[2:] if w != "IPv6"]
    else:
        proto = words[0].lower()
        if proto not in ("tcp", "udp", "sctp"):
            raise IpvsError(f"unknown protocol {words[0]!r}")
        addr, port = _split_hostport(words[1], default_port=None)
        key = ServiceKey(addr[0], proto, addr[1], port)  # type: ignore[arg-type]
        rest = words[2:]
    if not rest:
        raise IpvsError("service line without a scheduler")
    scheduler = rest[0]
    flags = 0
    timeout = 0
    netmask: int | None = None
    i = 1
    while i < len(rest):
        w = rest[i]
        if w.startswith("(") and w.endswith(")"):
            flags |= _flags_from_names(scheduler, w[1:-1])
        elif w == "persistent" and i + 1 < len(rest):
            flags |= SVC_F_PERSISTENT
            timeout = int(rest[i + 1])
            i += 1
        elif w == "mask" and i + 1 < len(rest):
            netmask = _netmask(key.version, rest[i + 1])
            i += 1
        elif w == "ops":
            flags |= SVC_F_ONEPACKET
        else:
            raise IpvsError(f"unexpected {w!r} on a service line")
        i += 1
    return ServiceSpec(key=key, scheduler=scheduler, flags=flags, timeout_s=timeout, netmask=netmask)


def _parse_dest_line(words: list[str], key: ServiceKey) -> tuple[DestSpec, int, int]:
    if len(words) != 6:
        raise IpvsError("expected '-> ADDR:PORT Forward Weight ActiveConn InActConn'")
    addr, port = _split_hostport(words[1], default_port=None)
    fwd = _NAME_FWD.get(words[2].lower())
    if fwd is None:
        raise IpvsError(f"unknown forwarding method {words[2]!r}; expected Masq, Route, Tunnel or Local")
    if not all(w.isdigit() for w in words[3:]):
        raise IpvsError("weight and connection counts must be numbers (use ipvsadm -Ln --exact?)")
    spec = DestSpec(addr=addr, port=port, weight=int(words[3]), forward=fwd)
    return spec, int(words[4]), int(words[5])


def load_list(text: str, *, nosort: bool = True, sysctls: Sysctls | None = None) -> IpvsTable:
    """Build a table from ``ipvsadm -Ln --nosort`` (default) or sorted ``ipvsadm -Ln`` text.

    Args:
        text: the listing; the three header lines are optional.
        nosort: the rows are in kernel list order (``--nosort`` or ``/proc/net/ip_vs``), so they
            are added last row first and the first row ends at the head. ``False``: a sorted
            listing, whose kernel order is unknown, is loaded as ``ipvsadm-restore`` would load
            the same rows (each added in turn, to the head).
        sysctls: settings for the new table.

    Raises:
        IpvsError: naming the line, for text that is not an ``ipvsadm -Ln`` listing.
    """
    table = IpvsTable(sysctls)
    current: tuple[ServiceKey, list[tuple[DestSpec, int, int]]] | None = None
    blocks: list[tuple[ServiceKey, list[tuple[DestSpec, int, int]]]] = []
    for n, line in _lines(text):
        words = line.split()
        try:
            if line.startswith("IP Virtual Server") or line.startswith("Prot ") or "RemoteAddress" in line:
                continue
            if words[0] == "->":
                if current is None:
                    raise IpvsError("real server row before any service")
                current[1].append(_parse_dest_line(words, current[0]))
                continue
            spec = _parse_service_line(words)
            table.add_service(spec)
            current = (spec.key, [])
            blocks.append(current)
        except (IpvsError, ValueError) as e:
            raise IpvsError(str(e), line=n, text=line) from None
    for key, rows in blocks:
        for dspec, active, inact in reversed(rows) if nosort else rows:
            dest = table.add_dest(key, dspec)
            dest.activeconns += active
            dest.inactconns += inact
    return table
