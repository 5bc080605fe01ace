"""The real kernel's netfilter: ``iptables`` and ``iptables-restore`` in a network namespace, as root.

:class:`LinuxNetfilter` implements :class:`~kproxy.kernel.netfilter.NetfilterKernel` as
kube-proxy's ``pkg/util/iptables`` does: ``EnsureChain`` is ``iptables -N`` ("already exists" is
fine), ``EnsureRule(Prepend)`` is ``iptables -C`` then ``iptables -I``, a restore is
``iptables-restore -w 5 --noflush --counters`` with the text on stdin (``ip6tables-*`` for IPv6).
nfacct objects are created with the ``nfacct`` tool (``nfacct add NAME``), sysctls with
``sysctl -w`` (logged), and stale conntrack entries are deleted with the ``conntrack`` tool.
Every command runs through :func:`asyncio.create_subprocess_exec` with a timeout.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from kproxy.errors import KernelError
from kproxy.kernel.conntrack import ConntrackFilter
from kproxy.kernel.netfilter import failing_line
from kproxy.model.names import IPFamily

__all__ = ["CommandResult", "LinuxNetfilter"]

_LINE = re.compile(r"line:?\s+(\d+)")
_DELETED = re.compile(r"(\d+) flow entries have been deleted")

_log = structlog.get_logger("kproxy.kernel")


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandResult:
    """A finished command: its ``argv``, exit ``returncode``, ``stdout`` and ``stderr`` text."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class LinuxNetfilter:
    """One IP family's tables of the running kernel (see the module docstring).

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

    async def ensure_sysctl(self, name: str, value: str) -> None:
        """``sysctl -w NAME=VALUE`` unless already set (logged).

        Raises:
            KernelError: the sysctl could not be read or set.
        """
        got = await self.run("sysctl", "-n", name)
        if got.returncode == 0 and got.stdout.strip() == value:
            return
        _log.info("setting a sysctl kube-proxy needs", sysctl=name, value=value, netns=self.netns)
        done = await self.run("sysctl", "-q", "-w", f"{name}={value}")
        if done.returncode != 0:
            raise KernelError(f"setting {name}={value} failed: {done.stderr.strip()}")

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

    async def restore(self, text: str, *, noflush: bool = True, counters: bool = True) -> None:
        """``iptables-restore -w N [--noflush] [--counters]`` of ``text``.

        Raises:
            KernelError: with the tool's stderr and the failing input line.
        """
        args = [f"{self._tool}-restore", "-w", str(self.wait_s)]
        if counters:
            args.append("--counters")
        if noflush:
            args.append("--noflush")
        done = await self.run(*args, stdin=text)
        if done.returncode != 0:
            m = _LINE.search(done.stderr)
            shown = failing_line(text, int(m.group(1))) if m else ""
            raise KernelError(f"{args[0]} failed (exit {done.returncode}): {done.stderr.strip()}"
                              + (f"; failing line: {shown}" if shown else ""))

    async def ensure_chain(self, table: str, chain: str) -> None:
        """``iptables -t TABLE -N CHAIN``; "already exists" is fine.

        Raises:
            KernelError: the chain could not be created.
        """
        made = await self.run(self._tool, "-w", str(self.wait_s), "-t", table, "-N", chain)
        if made.returncode != 0 and "exists" not in made.stderr:
            raise KernelError(f"creating chain {table}/{chain} failed: {made.stderr.strip()}")

    async def ensure_rule(self, table: str, chain: str, argv: Sequence[str]) -> bool:
        """``iptables -C``, then ``iptables -I`` when the rule is missing; True when it was there.

        Raises:
            KernelError: the rule could not be inserted.
        """
        check = await self.run(self._tool, "-w", str(self.wait_s), "-t", table, "-C", chain, *argv)
        if check.returncode == 0:
            return True
        added = await self.run(self._tool, "-w", str(self.wait_s), "-t", table, "-I", chain, *argv)
        if added.returncode != 0:
            raise KernelError(f"inserting {' '.join(argv)!r} into {table}/{chain} failed: "
                              f"{added.stderr.strip()}")
        return False

    async def delete_rule(self, table: str, chain: str, argv: Sequence[str]) -> bool:
        """``iptables -C``, then ``iptables -D`` when the rule is there; False when it is not.

        Raises:
            KernelError: the rule was there but could not be deleted.
        """
        check = await self.run(self._tool, "-w", str(self.wait_s), "-t", table, "-C", chain, *argv)
        if check.returncode != 0:
            return False
        done = await self.run(self._tool, "-w", str(self.wait_s), "-t", table, "-D", chain, *argv)
        if done.returncode != 0:
            raise KernelError(f"deleting {' '.join(argv)!r} from {table}/{chain} failed: "
                              f"{done.stderr.strip()}")
        return True

    async def create_nfacct(self, name: str) -> None:
        """``nfacct add NAME``; "exists" is fine.

        Raises:
            KernelError: the object could not be created.
        """
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

    async def list_chains(self, table: str) -> frozenset[str]:
        """The chains of ``table`` now (``iptables-save -t TABLE``).

        Raises:
            KernelError: ``iptables-save`` failed.
        """
        text = await self.save(table=table)
        return frozenset(line[1:].split()[0] for line in text.splitlines() if line.startswith(":"))
