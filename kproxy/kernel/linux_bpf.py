"""The Linux ``bpf()`` syscall through ctypes: maps, program loading, links, test runs (root).

No compiler and no libbpf: the attr unions are packed by hand at the offsets of
include/uapi/linux/bpf.h (``union bpf_attr``), in a zero-filled buffer of :data:`ATTR_SIZE`
bytes passed whole. A short buffer is not safe: some commands write results past the fields
given (``BPF_PROG_TEST_RUN`` writes ``retval``, ``data_size_out`` and ``duration``), and in an
experiment a short one corrupted the heap; the kernel accepts a longer one whose tail is zero
(``bpf_check_uarg_tail_zero``).

A failed ``BPF_PROG_LOAD`` is retried once with ``log_level = 1`` to get the verifier's log into
the error, as libbpf does. Links (``BPF_LINK_CREATE``) are owned by this process: closing the
fd, or the process dying, detaches the program.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Sequence

from emulation.bpf import AttachType, MapSpec, MapType
from kproxy.errors import KernelError
from kproxy.kernel.bpf import CGROUP_HOOKS, ProgramSpec, TestRun

__all__ = ["ATTR_SIZE", "LinuxBpf", "bpf_available"]

#: Bytes of the attr buffer: more than ``sizeof(union bpf_attr)`` of any kernel so far (about
#: 160 in 6.x); the zero tail is accepted.
ATTR_SIZE = 256
#: The verifier log buffer for the retry of a refused load.
LOG_SIZE = 1 << 20

_NR_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "riscv64": 280, "ppc64le": 361,
           "s390x": 351}


class Cmd:
    """bpf.h ``enum bpf_cmd`` values used here."""

    MAP_CREATE = 0
    MAP_LOOKUP_ELEM = 1
    MAP_UPDATE_ELEM = 2
    MAP_DELETE_ELEM = 3
    MAP_GET_NEXT_KEY = 4
    PROG_LOAD = 5
    PROG_TEST_RUN = 10
    MAP_UPDATE_BATCH = 26
    LINK_CREATE = 28


#: Map types whose kernel implementation has ``map_update_batch``.
_BATCH_TYPES = frozenset({MapType.HASH, MapType.ARRAY, MapType.LRU_HASH})
#: ENOTSUPP, the kernel-internal errno some batch paths return.
_ENOTSUPP = 524


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def bpf_available() -> bool:
    """Whether this process may call ``bpf()`` (root on a supported architecture)."""
    return os.geteuid() == 0 and platform.machine() in _NR_BPF


class _Attr:
    """A zero-filled ``union bpf_attr`` buffer and the buffers its pointers refer to."""

    def __init__(self) -> None:
        self.buf = ctypes.create_string_buffer(ATTR_SIZE)
        self._keep: list[ctypes.Array[ctypes.c_char]] = []

    def put(self, fmt: str, off: int, *values: int) -> None:
        struct.pack_into("<" + fmt, self.buf, off, *values)

    def get(self, fmt: str, off: int) -> int:
        value: int = struct.unpack_from("<" + fmt, self.buf, off)[0]
        return value

    def put_bytes(self, off: int, raw: bytes) -> None:
        ctypes.memmove(ctypes.addressof(self.buf) + off, raw, len(raw))

    def ptr(self, off: int, data: bytes | int) -> ctypes.Array[ctypes.c_char]:
        """Point the u64 at ``off`` to a new buffer holding ``data`` (or ``data`` zero bytes)."""
        b = ctypes.create_string_buffer(data) if isinstance(data, int) else \
            ctypes.create_string_buffer(bytes(data), len(data))
        self._keep.append(b)
        self.put("Q", off, ctypes.addressof(b))
        return b


class LinuxBpf:
    """A :class:`~kproxy.kernel.bpf.BpfKernel` over the real ``bpf()`` syscall (root).

    Raises:
        KernelError: at construction, on an architecture without a known syscall number.
    """

    def __init__(self) -> None:
        nr = _NR_BPF.get(platform.machine())
        if nr is None:
            raise KernelError(errno.ENOSYS, f"bpf(): no syscall number for {platform.machine()}")
        self._nr = nr
        self._syscall = _libc().syscall
        self._syscall.restype = ctypes.c_long
        self.syscalls = 0
        self._specs: dict[int, MapSpec] = {}

    def _call(self, cmd: int, attr: _Attr, what: str, *, ok: tuple[int, ...] = ()) -> int:
        self.syscalls += 1
        ret = self._syscall(ctypes.c_long(self._nr), ctypes.c_int(cmd), attr.buf,
                            ctypes.c_uint(ATTR_SIZE))
        if ret < 0:
            err = ctypes.get_errno()
            if err in ok:
                return -err
            raise KernelError(err, f"bpf({what}): {os.strerror(err)}")
        return int(ret)

    # ---- maps --------------------------------------------------------------------
    def create_map(self, spec: MapSpec, *, inner_fd: int | None = None) -> int:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.create_map`."""
        a = _Attr()
        a.put("IIIIII", 0, spec.type, spec.key_size, spec.value_size, spec.max_entries, spec.flags,
              inner_fd or 0)
        a.put_bytes(28, spec.name.encode()[:15])
        fd = self._call(Cmd.MAP_CREATE, a, f"BPF_MAP_CREATE {spec.name!r} {spec.type.name}")
        self._specs[fd] = spec
        return fd

    def _spec(self, fd: int) -> MapSpec:
        spec = self._specs.get(fd)
        if spec is None:
            raise KernelError(errno.EBADF, f"fd {fd} is not a map created here")
        return spec

    def lookup(self, fd: int, key: bytes) -> bytes | None:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.lookup` (maps of maps: the inner map's id)."""
        value_size = self._spec(fd).value_size
        a = _Attr()
        a.put("I", 0, fd)
        a.ptr(8, key)
        out = a.ptr(16, value_size)
        if self._call(Cmd.MAP_LOOKUP_ELEM, a, f"BPF_MAP_LOOKUP_ELEM fd {fd}", ok=(errno.ENOENT,)) < 0:
            return None
        return out.raw[:value_size]

    def update(self, fd: int, key: bytes, value: bytes, flags: int = 0) -> None:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.update`."""
        a = _Attr()
        a.put("I", 0, fd)
        a.ptr(8, key)
        a.ptr(16, value)
        a.put("Q", 24, flags)
        self._call(Cmd.MAP_UPDATE_ELEM, a, f"BPF_MAP_UPDATE_ELEM fd {fd} key {key.hex()}")

    def update_batch(self, fd: int, items: Sequence[tuple[bytes, bytes]], flags: int = 0) -> int:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.update_batch`: one ``BPF_MAP_UPDATE_BATCH``
        for map types that have it (hash, array, LRU), else one update per item."""
        if not items:
            return 0
        if self._spec(fd).type in _BATCH_TYPES:
            a = _Attr()
            a.ptr(16, b"".join(k for k, _ in items))
            a.ptr(24, b"".join(v for _, v in items))
            a.put("II", 32, len(items), fd)
            a.put("Q", 40, flags)
            ret = self._call(Cmd.MAP_UPDATE_BATCH, a, f"BPF_MAP_UPDATE_BATCH fd {fd}",
                             ok=(errno.EINVAL, _ENOTSUPP, errno.EOPNOTSUPP))
            if ret >= 0:
                return 1
        for key, value in items:
            self.update(fd, key, value, flags)
        return len(items)

    def delete(self, fd: int, key: bytes) -> bool:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.delete`."""
        a = _Attr()
        a.put("I", 0, fd)
        a.ptr(8, key)
        return self._call(Cmd.MAP_DELETE_ELEM, a, f"BPF_MAP_DELETE_ELEM fd {fd}", ok=(errno.ENOENT,)) >= 0

    def keys(self, fd: int) -> list[bytes]:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.keys`."""
        key_size = self._spec(fd).key_size
        out: list[bytes] = []
        prev: bytes | None = None
        for _ in range(1 << 24):
            a = _Attr()
            a.put("I", 0, fd)
            if prev is not None:
                a.ptr(8, prev)
            nxt = a.ptr(16, key_size)
            if self._call(Cmd.MAP_GET_NEXT_KEY, a, f"BPF_MAP_GET_NEXT_KEY fd {fd}", ok=(errno.ENOENT,)) < 0:
                return out
            prev = nxt.raw[:key_size]
            out.append(prev)
        raise KernelError(errno.E2BIG, f"map fd {fd}: more than 2**24 keys")

    # ---- programs ----------------------------------------------------------------
    def load_program(self, spec: ProgramSpec) -> int:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.load_program`."""
        try:
            return self._load(spec, log=False)
        except KernelError as first:
            try:
                return self._load(spec, log=True)
            except _Refused as e:
                raise KernelError(first.errno, f"bpf(BPF_PROG_LOAD {spec.name!r}): "
                                  f"{os.strerror(first.errno or 0)}; verifier log:\n{e.log}") from None

    def _load(self, spec: ProgramSpec, *, log: bool) -> int:
        a = _Attr()
        a.put("II", 0, spec.type, len(spec.code) // 8)
        a.ptr(8, spec.code)
        a.ptr(16, spec.license.encode() + b"\x00")
        logbuf = None
        if log:
            a.put("II", 24, 1, LOG_SIZE)
            logbuf = a.ptr(32, LOG_SIZE)
        a.put_bytes(48, spec.name.encode())
        a.put("I", 68, spec.attach or 0)
        try:
            return self._call(Cmd.PROG_LOAD, a, f"BPF_PROG_LOAD {spec.name!r}")
        except KernelError:
            if logbuf is None:
                raise
            raise _Refused(logbuf.value.decode(errors="replace").strip()) from None

    def attach_cgroup(self, prog_fd: int, cgroup: str, attach: AttachType) -> int:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.attach_cgroup`."""
        if attach not in CGROUP_HOOKS:
            raise KernelError(errno.EINVAL, f"{attach} is not a cgroup sock_addr hook")
        try:
            cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            raise KernelError(e.errno, f"cgroup {cgroup}: {e.strerror}") from None
        try:
            a = _Attr()
            a.put("III", 0, prog_fd, cg, attach)
            return self._call(Cmd.LINK_CREATE, a, f"BPF_LINK_CREATE {attach.name} on {cgroup}")
        finally:
            os.close(cg)

    def attach_tcx(self, prog_fd: int, ifindex: int, attach: AttachType) -> int:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.attach_tcx` (needs Linux 6.6)."""
        if attach not in (AttachType.TCX_INGRESS, AttachType.TCX_EGRESS):
            raise KernelError(errno.EINVAL, f"{attach} is not a tcx hook")
        a = _Attr()
        a.put("III", 0, prog_fd, ifindex, attach)
        return self._call(Cmd.LINK_CREATE, a, f"BPF_LINK_CREATE {attach.name} on ifindex {ifindex}")

    def test_run(self, prog_fd: int, data: bytes, *, repeat: int = 1) -> TestRun:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.test_run`."""
        a = _Attr()
        out_size = len(data) + 512
        a.put("I", 0, prog_fd)
        a.put("II", 8, len(data), out_size)
        a.ptr(16, data)
        out = a.ptr(24, out_size)
        a.put("I", 32, repeat)
        self._call(Cmd.PROG_TEST_RUN, a, f"BPF_PROG_TEST_RUN fd {prog_fd}")
        size = a.get("I", 12)
        return TestRun(retval=a.get("I", 4), data=out.raw[:size], duration_ns=a.get("I", 36))

    def close(self, fd: int) -> None:
        """See :meth:`~kproxy.kernel.bpf.BpfKernel.close`."""
        self._specs.pop(fd, None)
        try:
            os.close(fd)
        except OSError as e:
            raise KernelError(e.errno, f"close fd {fd}: {e.strerror}") from None


class _Refused(Exception):
    def __init__(self, log: str) -> None:
        self.log = log
