"""The emulator's load checks and save text against the real iptables-restore / iptables-save.

Each rule of :data:`tests.emulation.test_load_checks_from_users.ACCEPTED` is loaded with
``iptables-restore`` (``ip6tables-restore`` for IPv6) into a namespace this module creates, and
``iptables-save`` must print it as the emulator's ``save`` does; each rule of ``REFUSED`` must be
refused by the real tools as the emulator refuses it. One namespace serves the module and is
deleted after it; every case flushes the table it used.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from emulation.errors import NetfilterError
from emulation.netfilter import load, save
from tests.conftest import require_kernel
from tests.emulation.test_load_checks_from_users import ACCEPTED, REFUSED, restore_text, saved_rules
from tests.kernel.netns import cleanup_stale, netns, sh

TOOLS = ("iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save", "iptables", "ip6tables")


@pytest.fixture(scope="module")
def ns() -> Iterator[str]:
    """A namespace of its own for the module's restores, deleted after."""
    require_kernel(*TOOLS)
    cleanup_stale()
    with netns("loadchk") as name:
        yield name


def kernel_restore(ns: str, version: int, table: str, rule: str) -> tuple[int, list[str], str]:
    """Restore one rule with the real tool: (exit status, saved ``-A`` lines, stderr); then flush."""
    tool = "iptables" if version == 4 else "ip6tables"
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, f"{tool}-restore"],
        input=restore_text(table, rule), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    saved: list[str] = []
    if proc.returncode == 0:
        saved = saved_rules(sh("ip", "netns", "exec", ns, f"{tool}-save", "-t", table).stdout)
        sh("ip", "netns", "exec", ns, tool, "-t", table, "-F")
    return proc.returncode, saved, proc.stderr.strip()


@pytest.mark.parametrize(("version", "table", "rule", "saved"), ACCEPTED)
def test_kernel_loads_and_saves_as_the_emulator(
    ns: str, version: int, table: str, rule: str, saved: str
) -> None:
    """iptables-restore loads the rule and iptables-save prints what the emulator's save prints."""
    status, kernel_saved, err = kernel_restore(ns, version, table, rule)
    assert status == 0, err
    emulated = saved_rules(save(load(restore_text(table, rule), version=version, strict=True)))
    assert kernel_saved == emulated == [saved]


@pytest.mark.parametrize(("version", "table", "rule", "message"), REFUSED)
def test_kernel_refuses_what_the_emulator_refuses(
    ns: str, version: int, table: str, rule: str, message: str
) -> None:
    """iptables-restore refuses the rule (and loads nothing), as the emulator's load does."""
    status, kernel_saved, _ = kernel_restore(ns, version, table, rule)
    assert status != 0, kernel_saved
    with pytest.raises(NetfilterError, match=message):
        load(restore_text(table, rule), version=version, strict=True)
