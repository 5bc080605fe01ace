"""The real kernel's IPVS: ``ipvsadm``, ``ipset`` and ``ip`` in the current network namespace, as root.

:class:`LinuxIpvs` implements :class:`~kproxy.kernel.ipvs.IpvsKernel` with the commands an
operator would type (kube-proxy uses netlink directly; the kernel state is the same):

- virtual servers: ``ipvsadm -A|-E|-D -t|-u|--sctp-service VIP:PORT -s SCHED [-b FLAGS]
  [-p TIMEOUT]``; real servers: ``ipvsadm -a|-e|-d ... -r RIP:PORT -m -w WEIGHT``; the state is
  read back with ``ipvsadm -Sn`` (specs) and ``ipvsadm -Ln`` (connection counts);
- ``ipset restore -exist`` for the sets;
- ``ip addr add|del ADDR dev kube-ipvs0`` for the bound addresses (the dummy device must exist:
  ``ip link add kube-ipvs0 type dummy``, which needs the ``dummy`` module).

Each command runs synchronously (IPVS calls are synchronous in kube-proxy too) with a timeout,
through an injectable runner so the argv can be checked without root.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Sequence

from emulation.errors import EmulationError
from emulation.ipvs import DestSpec, IpvsTable, ServiceKey, ServiceSpec, format_rules, load_rules
from kproxy.errors import KernelError
from kproxy.kernel.ipvs import DestKey, RealServerInfo, VirtualServerInfo
from kproxy.kernel.ipvs_node import DUMMY_DEVICE
from kproxy.kernel.linux import CommandResult, LinuxNetfilter
from kproxy.model.names import IPFamily

__all__ = ["LinuxIpvs", "Runner"]

#: ``run(argv, stdin) -> CommandResult``: how a command is run (a subprocess by default).
Runner = Callable[[Sequence[str], str | None], CommandResult]
_ROW = re.compile(r"^\s+->\s+(\S+)\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)\s*$")
_SERVICE = re.compile(r"^(TCP|UDP|SCTP|FWM)\s+(\S+)")


def _subprocess(argv: Sequence[str], stdin: str | None, timeout_s: float = 30.0) -> CommandResult:
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except OSError as err:
        raise KernelError(f"cannot run {argv[0]!r} ({err}); is it installed and on PATH?") from err
    except subprocess.TimeoutExpired:
        raise KernelError(f"{' '.join(argv)} did not finish within {timeout_s} s") from None
    return CommandResult(argv=tuple(argv), returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)


def _lines(spec: ServiceSpec, dest: DestSpec | None = None) -> tuple[str, str]:
    """The ``-A ...`` line of ``spec`` and, with ``dest``, its ``-a ...`` line, as ``ipvsadm-save -n``."""
    table = IpvsTable()
    table.add_service(spec)
    if dest is not None:
        table.add_dest(spec.key, dest)
    lines = format_rules(table).splitlines()
    return lines[0], (lines[1] if dest is not None else "")


def _service_args(spec: ServiceSpec) -> list[str]:
    """``-t VIP:PORT`` (or ``-u``, ``--sctp-service``, ``-f MARK``) of a virtual server."""
    words = _lines(spec)[0].split()
    end = words.index("-s")
    return words[1:end]


class LinuxIpvs:
    """One family's IPVS, ipsets and ``kube-ipvs0`` on the running kernel (see the module docstring).

    Args:
        family: the IP family.
        run: how commands run (default: a subprocess with a 30 s timeout).
    """

    def __init__(self, family: IPFamily = IPFamily.IPv4, *, run: Runner | None = None) -> None:
        self.family = family
        self.netfilter: LinuxNetfilter = LinuxNetfilter(family)
        self._run: Runner = run or _subprocess

    def _ok(self, *argv: str, stdin: str | None = None) -> CommandResult:
        done = self._run(argv, stdin)
        if done.returncode != 0:
            raise KernelError(f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()}")
        return done

    def virtual_servers(self) -> tuple[VirtualServerInfo, ...]:
        """See :class:`~kproxy.kernel.ipvs.IpvsKernel`. Raises: KernelError: ipvsadm failed."""
        try:
            table = load_rules(self._ok("ipvsadm", "-Sn").stdout)
        except EmulationError as err:
            raise KernelError(f"ipvsadm -Sn printed what kproxy cannot read: {err}") from err
        counts = self._counts(self._ok("ipvsadm", "-Ln").stdout)
        out = []
        for svc in table.services():
            if svc.spec.key.version != (6 if self.family is IPFamily.IPv6 else 4):
                continue
            name = _service_args(svc.spec)[-1]
            reals = []
            for d in svc.dests:
                spec = svc.dest_spec(d)
                active, inactive = counts.get((name, _lines(svc.spec, spec)[1].split()[4]), (0, 0))
                reals.append(RealServerInfo(spec=spec, active_conns=active, inactive_conns=inactive))
            out.append(VirtualServerInfo(spec=svc.spec, real_servers=tuple(reals)))
        return tuple(out)

    @staticmethod
    def _counts(listing: str) -> dict[tuple[str, str], tuple[int, int]]:
        """``(virtual, real) -> (ActiveConn, InActConn)`` from ``ipvsadm -Ln``."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        current = ""
        for line in listing.splitlines():
            service = _SERVICE.match(line)
            if service:
                current = service.group(2)
                continue
            row = _ROW.match(line)
            if row and current:
                out[(current, row.group(1))] = (int(row.group(3)), int(row.group(4)))
        return out

    def virtual_server(self, key: ServiceKey) -> VirtualServerInfo | None:
        """See :class:`~kproxy.kernel.ipvs.IpvsKernel`. Raises: KernelError: ipvsadm failed."""
        return next((v for v in self.virtual_servers() if v.spec.key == key), None)

    def add_virtual_server(self, spec: ServiceSpec) -> None:
        """``ipvsadm -A``. Raises: KernelError: refused."""
        self._ok("ipvsadm", *_lines(spec)[0].split())

    def update_virtual_server(self, spec: ServiceSpec) -> None:
        """``ipvsadm -E``. Raises: KernelError: refused."""
        self._ok("ipvsadm", "-E", *_lines(spec)[0].split()[1:])

    def delete_virtual_server(self, key: ServiceKey) -> None:
        """``ipvsadm -D``. Raises: KernelError: refused."""
        self._ok("ipvsadm", "-D", *_service_args(ServiceSpec(key=key, scheduler="rr")))

    def add_real_server(self, key: ServiceKey, spec: DestSpec) -> None:
        """``ipvsadm -a``. Raises: KernelError: refused."""
        self._ok("ipvsadm", *_lines(ServiceSpec(key=key, scheduler="rr"), spec)[1].split())

    def update_real_server(self, key: ServiceKey, spec: DestSpec) -> None:
        """``ipvsadm -e``. Raises: KernelError: refused."""
        self._ok("ipvsadm", "-e", *_lines(ServiceSpec(key=key, scheduler="rr"), spec)[1].split()[1:])

    def delete_real_server(self, key: ServiceKey, dest: DestKey) -> None:
        """``ipvsadm -d``. Raises: KernelError: refused."""
        version, addr, port = dest
        line = _lines(ServiceSpec(key=key, scheduler="rr"), DestSpec(addr=(version, addr), port=port))[1]
        words = line.split()
        self._ok("ipvsadm", "-d", *words[1:5])

    def restore_ipsets(self, text: str) -> None:
        """``ipset restore -exist``. Raises: KernelError: refused."""
        self._ok("ipset", "restore", "-exist", stdin=text)

    def bind_addresses(self, addresses: tuple[str, ...]) -> None:
        """``ip addr add``/``del`` on ``kube-ipvs0`` until it holds exactly ``addresses`` of this family.

        Raises:
            KernelError: the device is missing or a change was refused.
        """
        flag = "-6" if self.family is IPFamily.IPv6 else "-4"
        shown = self._ok("ip", "-j", flag, "addr", "show", "dev", DUMMY_DEVICE).stdout
        try:
            current = {a["local"] for link in json.loads(shown or "[]") for a in link.get("addr_info", ())}
        except (ValueError, KeyError, TypeError) as err:
            raise KernelError(f"ip -j addr show dev {DUMMY_DEVICE} printed what kproxy cannot read: "
                              f"{err}") from err
        bits = 128 if self.family is IPFamily.IPv6 else 32
        wanted = set(addresses)
        for address in sorted(wanted - current):
            self._ok("ip", "addr", "add", f"{address}/{bits}", "dev", DUMMY_DEVICE)
        for address in sorted(current - wanted):
            self._ok("ip", "addr", "del", f"{address}/{bits}", "dev", DUMMY_DEVICE)
