"""Map semantics on both executors: the same operations on the emulated maps and on the kernel's
give the same values and the same errnos (hash flags, a full map, arrays, LPM tries, maps of
maps, LRU under capacity, batch updates)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from emulation.bpf import MapSpec, MapType
from kproxy.errors import KernelError
from kproxy.kernel.bpf import BpfKernel, EmulatedBpf
from kproxy.kernel.linux_bpf import LinuxBpf
from tests.kernel.conftest import Executor


def _kernel(executor: Executor) -> BpfKernel:
    return LinuxBpf() if executor is Executor.LINUX else EmulatedBpf()


def _k(i: int, n: int = 4) -> bytes:
    return i.to_bytes(n, "little")


def _log(k: BpfKernel) -> list[object]:
    """Run the scenario; each step's outcome (a value, None, True/False, or an errno)."""
    out: list[object] = []
    fds: list[int] = []

    def step(fn: Callable[[], object]) -> None:
        try:
            out.append(fn())
        except KernelError as e:
            out.append(("errno", e.errno))

    try:
        h = k.create_map(MapSpec(type=MapType.HASH, key_size=4, value_size=4, max_entries=2, name="h"))
        fds.append(h)
        step(lambda: k.update(h, _k(1), _k(10), 1))
        step(lambda: k.update(h, _k(1), _k(11), 1))  # NOEXIST on a present key
        step(lambda: k.update(h, _k(2), _k(20), 2))  # EXIST on a missing key
        step(lambda: k.update(h, _k(2), _k(20)))
        step(lambda: k.update(h, _k(3), _k(30)))  # full
        step(lambda: k.lookup(h, _k(1)))
        step(lambda: k.lookup(h, _k(3)))
        step(lambda: k.delete(h, _k(3)))
        step(lambda: sorted(k.keys(h)))
        a = k.create_map(MapSpec(type=MapType.ARRAY, key_size=4, value_size=8, max_entries=3, name="a"))
        fds.append(a)
        step(lambda: k.lookup(a, _k(2)))
        step(lambda: k.lookup(a, _k(3)))
        step(lambda: k.update(a, _k(3), bytes(8)))
        step(lambda: k.update(a, _k(0), bytes(8), 1))
        step(lambda: k.delete(a, _k(0)))
        step(lambda: k.update_batch(a, [(_k(i), _k(i, 8)) for i in range(3)]) > 0)
        step(lambda: [k.lookup(a, _k(i)) for i in range(3)])
        t = k.create_map(MapSpec(type=MapType.LPM_TRIE, key_size=8, value_size=1, max_entries=8,
                                 flags=1, name="t"))
        fds.append(t)
        step(lambda: k.update(t, _k(8) + bytes([10, 0, 0, 0]), b"\x08"))
        step(lambda: k.update(t, _k(24) + bytes([10, 1, 2, 0]), b"\x18"))
        step(lambda: k.update(t, _k(33) + bytes([10, 1, 2, 0]), b"\x21"))
        ips = ([10, 1, 2, 3], [10, 9, 9, 9], [11, 0, 0, 1])
        step(lambda: [k.lookup(t, _k(32) + bytes(ip)) for ip in ips])
        inner_spec = MapSpec(type=MapType.ARRAY, key_size=4, value_size=4, max_entries=1, name="in")
        inner = k.create_map(inner_spec)
        fds.append(inner)
        o = k.create_map(MapSpec(type=MapType.HASH_OF_MAPS, key_size=2, value_size=4, max_entries=4,
                                 name="o", inner=inner_spec), inner_fd=inner)
        fds.append(o)
        step(lambda: k.update(o, b"\x01\x00", _k(inner)))
        step(lambda: k.lookup(o, b"\x01\x00") is not None)
        step(lambda: k.delete(o, b"\x01\x00"))
        step(lambda: k.delete(o, b"\x01\x00"))
        lru = k.create_map(MapSpec(type=MapType.LRU_HASH, key_size=4, value_size=4, max_entries=64, name="l"))
        fds.append(lru)
        step(lambda: k.update_batch(lru, [(_k(i), _k(i)) for i in range(8)]) > 0)
        step(lambda: sorted(k.keys(lru)))
    finally:
        for fd in reversed(fds):
            k.close(fd)
    return out


@pytest.fixture(scope="module")
def emulated_log() -> list[object]:
    """What the emulated maps answer."""
    return _log(EmulatedBpf())


def test_maps_answer_as_the_kernel_does(executor: Executor, emulated_log: list[object]) -> None:
    """Each executor answers the scenario exactly as the emulated maps do (so as each other)."""
    assert _log(_kernel(executor)) == emulated_log
    assert ("errno", 17) in emulated_log and ("errno", 7) in emulated_log  # EEXIST, E2BIG
