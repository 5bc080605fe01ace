"""The real kernel: ``iptables-restore`` in the current (or a named) network namespace, as root.

Follows kube-proxy's ``syncProxyRules`` and ``pkg/util/iptables``: on a full sync, for each of
:data:`~kproxy.kernel.base.ENSURED_JUMPS`, ``EnsureChain`` (``iptables -N``; "already exists"
is fine) then ``EnsureRule(Prepend)`` (``iptables -C``, and ``iptables -I`` when it is missing);
then ``iptables-restore -w 5 --noflush --counters`` with the text on stdin (``ip6tables-*`` for
IPv6). Every command runs through :func:`asyncio.create_subprocess_exec` with a timeout.

nfacct objects are created with the ``nfacct`` tool (``nfacct add NAME``) when asked for; the
default configuration needs none.

On its first full sync of a result that serves IPv4 localhost NodePorts it sets
``net.ipv4.conf.all.route_localnet=1`` (in its namespace), as kube-proxy's iptables proxier does
(``--iptables-localhost-nodeports``, issue 90259), and logs it. Stale UDP/SCTP conntrack entries
are deleted with the ``conntrack`` tool (:meth:`LinuxKernel.clear_conntrack`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from kproxy.errors import KernelError
from kproxy.kernel.base import ENSURED_JUMPS, failing_line
from kproxy.kernel.conntrack import ConntrackFilter
from kproxy.model.names import IPFamily
from kproxy.modes.iptables import RenderResult

__all__ = ["CommandResult", "LinuxKernel"]

_LINE = re.compile(r"line:?\s+(\d+)")
_DELETED = re.compile(r"(\d+) flow entries have been deleted")
#: kube-proxy's ``sysctlRouteLocalnet``, as ``sysctl`` names it.
ROUTE_LOCALNET = "net.ipv4.conf.all.route_localnet"

_log = structlog.get_logger("kproxy.kernel")


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandResult:
    """A finished command: its ``argv``, exit ``returncode``, ``stdout`` and ``stderr`` text."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class LinuxKernel:
    """Applies iptables-mode results to the running kernel.

    Args:
        family: IPv4 (``iptables``) or IPv6 (``ip6tables``).
        netns: run every command inside ``ip netns exec NETNS`` (tests); None means the
            current network namespace (``kproxy run --kernel linux``).
        wait_s: ``-w`` seconds to wait for the xtables lock.
        timeout_s: seconds after which a command is killed and :class:`KernelError` raised.
    """

    def __init__(self, family: IPFamily = IPFamily.IPv4, *, netns: str | None = None,
                 wait_s: int = 5, timeout_s: float = 60.0) -> None:
        self.family = family
        self.netns = netns
        self.wait_s = wait_s
        self.timeout_s = timeout_s
        self._tool = "ip6tables" if family is IPFamily.IPv6 else "iptables"
        self._sysctls_done = False

    def _argv(self, *args: str) -> tuple[str, ...]:
        prefix = ("ip", "netns", "exec", self.netns) if self.netns else ()
        return (*prefix, *args)

    async def run(self, *args: str, stdin: str | None = None) -> CommandResult:
        """Run one command (prefixed for :attr:`netns`) and collect its output.

        Raises:
            KernelError: the command could not be started or did not finish in ``timeout_s``.
        """
        argv = self._argv(*args)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as err:
            raise KernelError(f"cannot run {argv[0]!r} ({err}); is it installed and on PATH?") from err
        try:
            async with asyncio.timeout(self.timeout_s):
                out, err_out = await proc.communicate(stdin.encode() if stdin is not None else None)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise KernelError(f"{' '.join(argv)} did not finish within {self.timeout_s} s") from None
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        return CommandResult(argv=argv, returncode=proc.returncode or 0,
                             stdout=out.decode(errors="replace"), stderr=err_out.decode(errors="replace"))

    async def apply(self, result: RenderResult, *, nfacct: Sequence[str] = ()) -> None:
        """Program ``result`` (see the module docstring).

        Raises:
            KernelError: an nfacct object, a jump rule or the restore failed; for the restore
                the message holds its stderr and the failing line of the input.
        """
        if result.full:
            if not self._sysctls_done:
                if result.route_localnet and self.family is IPFamily.IPv4:
                    await self.ensure_route_localnet()
                self._sysctls_done = True
            for name in nfacct:
                await self._ensure_nfacct(name)
            await self.ensure_jumps()
        await self.restore(result.text, noflush=True)

    async def ensure_route_localnet(self) -> None:
        """``sysctl -w net.ipv4.conf.all.route_localnet=1`` unless already set (logged).

        Raises:
            KernelError: the sysctl could not be read or set.
        """
        got = await self.run("sysctl", "-n", ROUTE_LOCALNET)
        if got.returncode == 0 and got.stdout.strip() == "1":
            return
        _log.info("setting route_localnet=1 to allow NodePorts on localhost; to change this disable "
                  "localhost NodePorts or set --nodeport-addresses to exclude loopback addresses",
                  sysctl=ROUTE_LOCALNET, netns=self.netns)
        done = await self.run("sysctl", "-q", "-w", f"{ROUTE_LOCALNET}=1")
        if done.returncode != 0:
            raise KernelError(f"setting {ROUTE_LOCALNET}=1 failed: {done.stderr.strip()}")

    async def clear_conntrack(self, filters: Sequence[ConntrackFilter]) -> int:
        """``conntrack -D ...`` for each filter (in :attr:`netns`); return how many entries went.

        ``conntrack`` exits 1 with "0 flow entries have been deleted" when nothing matched;
        that is not an error.

        Raises:
            KernelError: the tool is missing or failed otherwise.
        """
        total = 0
        for f in filters:
            done = await self.run("conntrack", *f.argv())
            m = _DELETED.search(done.stderr + done.stdout)
            if done.returncode != 0 and not (m and m.group(1) == "0"):
                raise KernelError(f"conntrack {' '.join(f.argv())} failed (exit {done.returncode}): "
                                  f"{done.stderr.strip()}")
            total += int(m.group(1)) if m else 0
        return total

    async def restore(self, text: str, *, noflush: bool = True) -> None:
        """``iptables-restore -w N [--noflush] --counters`` of ``text``.

        Raises:
            KernelError: with the tool's stderr and the failing input line.
        """
        args = [f"{self._tool}-restore", "-w", str(self.wait_s), "--counters"]
        if noflush:
            args.append("--noflush")
        done = await self.run(*args, stdin=text)
        if done.returncode != 0:
            m = _LINE.search(done.stderr)
            shown = failing_line(text, int(m.group(1))) if m else ""
            raise KernelError(f"{args[0]} failed (exit {done.returncode}): {done.stderr.strip()}"
                              + (f"; failing line: {shown}" if shown else ""))

    async def ensure_jumps(self) -> None:
        """kube-proxy's ``EnsureChain`` + ``EnsureRule(Prepend)`` for every ensured jump.

        Raises:
            KernelError: a chain could not be created or a rule inserted.
        """
        for jump in ENSURED_JUMPS:
            made = await self.run(self._tool, "-w", str(self.wait_s), "-t", jump.table, "-N", jump.target)
            if made.returncode != 0 and "exists" not in made.stderr:
                raise KernelError(f"creating chain {jump.table}/{jump.target} failed: {made.stderr.strip()}")
            check = await self.run(self._tool, "-w", str(self.wait_s), "-t", jump.table, "-C", jump.chain,
                                   *jump.argv)
            if check.returncode == 0:
                continue
            added = await self.run(self._tool, "-w", str(self.wait_s), "-t", jump.table, "-I", jump.chain,
                                   *jump.argv)
            if added.returncode != 0:
                raise KernelError(f"inserting {jump.restore_line()!r} into {jump.table}/{jump.chain} "
                                  f"failed: {added.stderr.strip()}")

    async def _ensure_nfacct(self, name: str) -> None:
        done = await self.run("nfacct", "add", name)
        if done.returncode != 0 and "exists" not in done.stderr.lower():
            raise KernelError(f"creating nfacct object {name!r} failed: {done.stderr.strip()}")

    async def save(self, *, counters: bool = False, table: str | None = None) -> str:
        """``iptables-save [-c] [-t TABLE]`` output, ``#`` comment lines removed.

        Raises:
            KernelError: the command failed.
        """
        args = [f"{self._tool}-save"]
        if counters:
            args.append("-c")
        if table:
            args += ["-t", table]
        done = await self.run(*args)
        if done.returncode != 0:
            raise KernelError(f"{' '.join(args)} failed: {done.stderr.strip()}")
        return "".join(line + "\n" for line in done.stdout.splitlines() if line and not line.startswith("#"))

    async def existing_chains(self) -> frozenset[str]:
        """The nat table's chains now (``iptables-save -t nat``).

        Raises:
            KernelError: ``iptables-save`` failed.
        """
        text = await self.save(table="nat")
        return frozenset(line[1:].split()[0] for line in text.splitlines() if line.startswith(":"))
