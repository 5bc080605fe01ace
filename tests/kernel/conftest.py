"""The executor fixture: every suite in ``tests/kernel/`` runs on the emulated kernel and on Linux.

A test that takes ``executor`` runs twice: once with :attr:`Executor.EMULATED` (the pure-Python
models of :mod:`emulation`, always) and once with :attr:`Executor.LINUX` (network namespaces
this run creates, the real ``iptables-restore``, ``conntrack`` and sockets). The Linux
parameter carries the ``kernel`` mark, and choosing it calls :func:`tests.conftest.require_kernel`
with the tools the module lists in ``KERNEL_TOOLS``: without root (or a tool) it skips, and under
``KPROXY_REQUIRE_KERNEL=1`` (``.ci/run``) it fails instead, as every real-kernel test does.

The fixture is module-scoped, so a module's namespaces (built by module-scoped fixtures that
depend on ``executor``) are made once per executor; pytest runs a module's emulated tests
first, then its Linux ones. After uvloop's ``_TestTCP`` / ``_TestUV`` mixins: one scenario, two
implementations of the thing under it.
"""

from __future__ import annotations

import enum
import shutil
from collections.abc import Iterator

import pytest

from tests.conftest import require_kernel
from tests.kernel.netns import cleanup_stale, netns
from tests.kernel.restore import EmulatedRestorer, LinuxRestorer, Restorer


class Executor(enum.Enum):
    """Where a suite's scenario runs."""

    EMULATED = "emulated"
    LINUX = "linux"


@pytest.fixture(
    scope="module",
    params=[Executor.EMULATED, pytest.param(Executor.LINUX, marks=pytest.mark.kernel)],
    ids=lambda e: e.value,
)
def executor(request: pytest.FixtureRequest) -> Executor:
    """The executor of this run of the suite; for Linux, root and the module's tools are required.

    A module names the programs its Linux half runs in ``KERNEL_TOOLS`` (a tuple of names on
    ``PATH``; ``ip`` is always required).
    """
    chosen: Executor = request.param
    if chosen is Executor.LINUX:
        require_kernel(*getattr(request.module, "KERNEL_TOOLS", ()))
    return chosen


@pytest.fixture(scope="module")
def restorers(executor: Executor) -> Iterator[list[Restorer]]:
    """What restores texts on this executor: the emulator, or the real tools in a namespace
    made for the module (deleted after), both the default (nf_tables) ``iptables-restore`` and,
    where installed, ``iptables-legacy-restore`` (x_tables), which must agree."""
    if executor is Executor.EMULATED:
        yield [EmulatedRestorer()]
        return
    cleanup_stale()
    with netns("restore") as name:
        found = [LinuxRestorer(name)]
        if shutil.which("iptables-legacy-restore") and shutil.which("ip6tables-legacy-restore"):
            found.append(LinuxRestorer(name, legacy=True))
        yield found
