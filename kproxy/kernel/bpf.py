"""The narrow BPF interface the eBPF mode programs through, and its emulated twin.

As kproxy's other kernel interfaces (:mod:`kproxy.kernel.netfilter`), :class:`BpfKernel` is
narrow: create a map; look up, update (one or a batch), delete and list its entries; load a
program (the verifier's log comes back in the error); link it to a cgroup hook or a device's
tcx hook; test-run it; close an fd. Everything is by fd, as the ``bpf()`` syscall is, and a
closed link fd detaches its program, so nothing outlives the process that attached it
(``bpf_link`` semantics).

Two implementations: :class:`EmulatedBpf` here, over the BPF machine of :mod:`emulation.bpf`
(rootless; the same bytecode runs in :class:`emulation.bpf.Machine`), and
:class:`~kproxy.kernel.linux_bpf.LinuxBpf`, the real ``bpf()`` syscall through ctypes (root).
Map specs, program and attach types are :mod:`emulation.bpf`'s, which follow bpf.h.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from emulation.bpf import (
    AttachType,
    BpfFault,
    BpfMap,
    Machine,
    MapError,
    MapSpec,
    MapType,
    ProgType,
    RunResult,
    SkBuff,
    SockAddr,
    decode,
    new_map,
)
from kproxy.errors import InvalidArgument, KernelError

__all__ = [
    "CGROUP_HOOKS",
    "BpfKernel",
    "EmulatedBpf",
    "LinkInfo",
    "ProgramSpec",
    "TestRun",
]

#: The cgroup sock_addr hooks kproxy attaches (socket-LB, as Cilium's bpf_sock.c).
CGROUP_HOOKS = frozenset({
    AttachType.CGROUP_INET4_CONNECT, AttachType.CGROUP_INET6_CONNECT,
    AttachType.CGROUP_UDP4_SENDMSG, AttachType.CGROUP_UDP6_SENDMSG,
    AttachType.CGROUP_UDP4_RECVMSG, AttachType.CGROUP_UDP6_RECVMSG,
    AttachType.CGROUP_INET4_GETPEERNAME, AttachType.CGROUP_INET6_GETPEERNAME,
})
_TCX = frozenset({AttachType.TCX_INGRESS, AttachType.TCX_EGRESS})


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramSpec:
    """What ``BPF_PROG_LOAD`` takes.

    Attributes:
        type: the program type.
        code: the bytecode (8 bytes a slot), map fds already in place (:meth:`Asm.assemble`).
        attach: ``expected_attach_type`` (required for cgroup sock_addr programs), or None.
        name: up to 15 characters of ``[A-Za-z0-9_.]``.
        license: the license string the kernel records (GPL-only helpers need a GPL one).
    """

    type: ProgType
    code: bytes
    attach: AttachType | None = None
    name: str = ""
    license: str = "Apache-2.0"

    def __post_init__(self) -> None:
        if not self.code or len(self.code) % 8:
            raise InvalidArgument(f"program {self.name!r}: bytecode is a non-empty multiple of 8 "
                                  f"bytes, got {len(self.code)}")
        if len(self.name) > 15 or not all(c.isalnum() or c in "_." for c in self.name):
            raise InvalidArgument(f"program name {self.name!r}: at most 15 of [A-Za-z0-9_.]")
        if self.type == ProgType.CGROUP_SOCK_ADDR and self.attach not in CGROUP_HOOKS:
            raise InvalidArgument(f"program {self.name!r}: a sock_addr program needs one of the "
                                  f"cgroup hooks as its attach type, got {self.attach}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TestRun:
    """What ``BPF_PROG_TEST_RUN`` returned.

    Attributes:
        retval: the program's return code (u32).
        data: the packet after the run.
        duration_ns: mean nanoseconds per run (0 when emulated).
    """

    __test__ = False  # not a pytest class

    retval: int
    data: bytes
    duration_ns: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkInfo:
    """One live link: the program fd, the hook, and the cgroup path or ifindex."""

    prog_fd: int
    attach: AttachType
    cgroup: str = ""
    ifindex: int = 0


@runtime_checkable
class BpfKernel(Protocol):
    """The ``bpf()`` operations kproxy uses, emulated or real. Keys and values are raw bytes,
    laid out as the programs read them (Cilium's structs for the eBPF mode)."""

    def create_map(self, spec: MapSpec, *, inner_fd: int | None = None) -> int:
        """``BPF_MAP_CREATE``; the new map's fd. Maps of maps name a template inner map.

        Raises:
            KernelError: refused (its errno and message).
        """
        ...

    def lookup(self, fd: int, key: bytes) -> bytes | None:
        """``BPF_MAP_LOOKUP_ELEM``: the value, or None when absent.

        Raises:
            KernelError: refused for another reason than ENOENT.
        """
        ...

    def update(self, fd: int, key: bytes, value: bytes, flags: int = 0) -> None:
        """``BPF_MAP_UPDATE_ELEM`` (maps of maps: ``value`` is the inner map's fd as u32).

        Raises:
            KernelError: refused (EEXIST, ENOENT, E2BIG, EINVAL...).
        """
        ...

    def update_batch(self, fd: int, items: Sequence[tuple[bytes, bytes]], flags: int = 0) -> int:
        """``BPF_MAP_UPDATE_BATCH`` where the map type has it, else one update per item.

        Returns:
            The number of syscalls made.

        Raises:
            KernelError: an entry was refused (those before it are written).
        """
        ...

    def delete(self, fd: int, key: bytes) -> bool:
        """``BPF_MAP_DELETE_ELEM``; False when there was no such key.

        Raises:
            KernelError: refused for another reason than ENOENT.
        """
        ...

    def keys(self, fd: int) -> list[bytes]:
        """Every key (``BPF_MAP_GET_NEXT_KEY`` from NULL).

        Raises:
            KernelError: the walk failed.
        """
        ...

    def load_program(self, spec: ProgramSpec) -> int:
        """``BPF_PROG_LOAD``; the program's fd.

        Raises:
            KernelError: the verifier refused it; the message ends with its log.
        """
        ...

    def attach_cgroup(self, prog_fd: int, cgroup: str, attach: AttachType) -> int:
        """``BPF_LINK_CREATE`` on the cgroup v2 folder ``cgroup``; the link's fd.

        Raises:
            KernelError: the cgroup or the attach was refused.
        """
        ...

    def attach_tcx(self, prog_fd: int, ifindex: int, attach: AttachType) -> int:
        """``BPF_LINK_CREATE`` at tcx ingress (46) or egress (47) of device ``ifindex``.

        Raises:
            KernelError: refused (no such device, a kernel without tcx).
        """
        ...

    def test_run(self, prog_fd: int, data: bytes, *, repeat: int = 1) -> TestRun:
        """``BPF_PROG_TEST_RUN`` of a tc program over the frame ``data`` (from its Ethernet header).

        Raises:
            KernelError: refused.
        """
        ...

    def close(self, fd: int) -> None:
        """Close an fd; a link's close detaches its program.

        Raises:
            KernelError: not an fd of this kernel.
        """
        ...


def _kernel_error(e: MapError | BpfFault, what: str) -> KernelError:
    if isinstance(e, MapError):
        return KernelError(e.errno, f"{what}: {e.strerror}")
    return KernelError(errno.EACCES, f"{what}: refused by the emulated verifier: {e}")


class EmulatedBpf:
    """A :class:`BpfKernel` over emulated maps and the BPF machine, rootless.

    Programs attached to a cgroup run at :meth:`run_sock_addr`, those at tcx at
    :meth:`run_tc`; ``BPF_PROG_TEST_RUN`` runs the machine once. Loading a program runs no
    verifier; the machine checks the same things as the program runs.

    Args:
        clock_ns: ``bpf_ktime_get_ns`` (monotonic nanoseconds).
        rng: ``bpf_get_prandom_u32``'s source.
    """

    def __init__(self, *, clock_ns: Callable[[], int] = lambda: 0,
                 rng: random.Random | None = None) -> None:
        self._next_fd = 3
        self.maps: dict[int, BpfMap] = {}
        self.programs: dict[int, ProgramSpec] = {}
        self.links: dict[int, LinkInfo] = {}
        # Closed fds whose objects the kernel would keep alive: maps a loaded program names,
        # programs a link holds. Emulated fds are never reused, so these cannot collide.
        self._retired_maps: dict[int, BpfMap] = {}
        self._retired_programs: dict[int, ProgramSpec] = {}
        self.clock_ns = clock_ns
        self.rng = rng if rng is not None else random.Random(0)
        self.syscalls = 0

    def _fd(self) -> int:
        fd, self._next_fd = self._next_fd, self._next_fd + 1
        return fd

    def _map(self, fd: int) -> BpfMap:
        self.syscalls += 1
        if fd not in self.maps:
            raise KernelError(errno.EBADF, f"fd {fd} is not a map")
        return self.maps[fd]

    def machine(self) -> Machine:
        """A machine over this kernel's maps (fds as the programs name them)."""
        maps = {**self._retired_maps, **self.maps}
        return Machine(maps, names={fd: m.spec.name for fd, m in maps.items()},
                       clock_ns=self.clock_ns, rng=self.rng)

    # ---- maps --------------------------------------------------------------------
    def create_map(self, spec: MapSpec, *, inner_fd: int | None = None) -> int:
        """See :meth:`BpfKernel.create_map`."""
        self.syscalls += 1
        if spec.type in (MapType.ARRAY_OF_MAPS, MapType.HASH_OF_MAPS) and (
                inner_fd not in self.maps or not spec.compatible(self.maps[inner_fd].spec)):
            raise KernelError(errno.EINVAL, f"map {spec.name!r}: inner_fd {inner_fd} is no matching map")
        fd = self._fd()
        self.maps[fd] = new_map(spec, fd)
        return fd

    def lookup(self, fd: int, key: bytes) -> bytes | None:
        """See :meth:`BpfKernel.lookup`."""
        try:
            return self._map(fd).lookup(key)
        except MapError as e:
            raise _kernel_error(e, f"lookup in map fd {fd}") from None

    def update(self, fd: int, key: bytes, value: bytes, flags: int = 0) -> None:
        """See :meth:`BpfKernel.update`."""
        m = self._map(fd)
        try:
            if m.spec.type in (MapType.ARRAY_OF_MAPS, MapType.HASH_OF_MAPS):
                inner = self.maps.get(int.from_bytes(value, "little"))
                if inner is None:
                    raise KernelError(errno.EBADF, f"map fd {fd}: inner fd {value.hex()} is not a map")
                m.update(key, inner, flags)
            else:
                m.update(key, value, flags)
        except MapError as e:
            raise _kernel_error(e, f"update of map fd {fd}") from None

    def update_batch(self, fd: int, items: Sequence[tuple[bytes, bytes]], flags: int = 0) -> int:
        """See :meth:`BpfKernel.update_batch` (one emulated syscall for the batch)."""
        m = self._map(fd)
        for key, value in items:
            try:
                m.update(key, value, flags)
            except MapError as e:
                raise _kernel_error(e, f"batch update of map fd {fd}") from None
        return 1

    def delete(self, fd: int, key: bytes) -> bool:
        """See :meth:`BpfKernel.delete`."""
        try:
            self._map(fd).delete(key)
        except MapError as e:
            if e.errno == errno.ENOENT:
                return False
            raise _kernel_error(e, f"delete from map fd {fd}") from None
        return True

    def keys(self, fd: int) -> list[bytes]:
        """See :meth:`BpfKernel.keys`."""
        return list(self._map(fd).keys())

    # ---- programs ----------------------------------------------------------------
    def load_program(self, spec: ProgramSpec) -> int:
        """See :meth:`BpfKernel.load_program`: the lddw map fds must name maps of this kernel."""
        self.syscalls += 1
        insns = decode(spec.code)
        for i, insn in enumerate(insns):
            if insn.opcode == 0x18 and insn.src in (1, 2) and insn.imm not in self.maps:
                raise KernelError(errno.EBADF, f"program {spec.name!r}: insn {i} loads fd "
                                  f"{insn.imm}, not a map (verifier: fd {insn.imm} is not pointing "
                                  "to valid bpf_map)")
        fd = self._fd()
        self.programs[fd] = spec
        return fd

    def attach_cgroup(self, prog_fd: int, cgroup: str, attach: AttachType) -> int:
        """See :meth:`BpfKernel.attach_cgroup` (the cgroup is a path, not checked on disk)."""
        spec = self.programs.get(prog_fd)
        if spec is None or spec.attach != attach or attach not in CGROUP_HOOKS:
            raise KernelError(errno.EINVAL, f"program fd {prog_fd} cannot attach at {attach}")
        fd = self._fd()
        self.links[fd] = LinkInfo(prog_fd=prog_fd, attach=attach, cgroup=cgroup.rstrip("/"))
        return fd

    def attach_tcx(self, prog_fd: int, ifindex: int, attach: AttachType) -> int:
        """See :meth:`BpfKernel.attach_tcx`."""
        spec = self.programs.get(prog_fd)
        if spec is None or spec.type != ProgType.SCHED_CLS or attach not in _TCX:
            raise KernelError(errno.EINVAL, f"program fd {prog_fd} cannot attach at {attach}")
        fd = self._fd()
        self.links[fd] = LinkInfo(prog_fd=prog_fd, attach=attach, ifindex=ifindex)
        return fd

    def test_run(self, prog_fd: int, data: bytes, *, repeat: int = 1) -> TestRun:
        """See :meth:`BpfKernel.test_run`: one machine run over the frame."""
        spec = self.programs.get(prog_fd)
        if spec is None or spec.type != ProgType.SCHED_CLS:
            raise KernelError(errno.EINVAL, f"fd {prog_fd} is no tc program")
        try:
            res = self.machine().run(spec.code, SkBuff(packet=data))
        except BpfFault as e:
            raise _kernel_error(e, f"test run of {spec.name!r}") from None
        return TestRun(retval=res.ret32, data=res.packet)

    def close(self, fd: int) -> None:
        """See :meth:`BpfKernel.close`. As in the kernel, a map stays usable by the programs
        that name it, and a program stays linked while a link holds it."""
        if fd in self.links:
            del self.links[fd]
        elif fd in self.programs:
            self._retired_programs[fd] = self.programs.pop(fd)
        elif fd in self.maps:
            self._retired_maps[fd] = self.maps.pop(fd)
        else:
            raise KernelError(errno.EBADF, f"fd {fd} is not open")

    # ---- the hooks ----------------------------------------------------------------
    def run_sock_addr(self, cgroup: str, ctx: SockAddr) -> RunResult | None:
        """Run the programs linked at ``ctx.attach`` on ``cgroup`` and its ancestors, innermost
        first as the kernel's effective array orders them; each sees the previous rewrite.

        Returns:
            The last run (``ret32`` 0 when one refused), or None when nothing is attached.

        Raises:
            KernelError: a program faulted.
        """
        path = cgroup.rstrip("/")
        chain = [link for link in self.links.values() if link.attach == ctx.attach
                 and (path == link.cgroup or path.startswith(link.cgroup + "/"))]
        chain.sort(key=lambda link: -len(link.cgroup))
        result = None
        for link in chain:
            spec = self.programs.get(link.prog_fd) or self._retired_programs[link.prog_fd]
            try:
                result = self.machine().run(spec.code, ctx)
            except BpfFault as e:
                raise _kernel_error(e, f"program at {ctx.attach.name}") from None
            assert isinstance(result.ctx, SockAddr)
            ctx = result.ctx
            if result.ret32 != 1:
                break
        return result
