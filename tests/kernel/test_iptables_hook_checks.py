"""The emulator's hook check (a target reachable from a hook it is not usable from) against the
real ``iptables-restore``: every case of tests/emulation/test_nat_hook_checks.py is loaded into
a namespace this module creates (deleted after), with the default tool and with the legacy
(x_tables) one when present; each must be refused or loaded exactly as the emulator does.

The nf_tables backend words its errors differently (no ``used from hooks`` line: the kernel's
``nft_compat`` validation fails the transaction with EINVAL / EOPNOTSUPP), so only the outcome
is compared, never the text.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest

from emulation.errors import NetfilterError
from emulation.netfilter import load, save
from tests.conftest import require_kernel
from tests.emulation.test_nat_hook_checks import ACCEPTED, ICMP_MATCH, PROTO_SAVED, REFUSED, filt
from tests.kernel.netns import cleanup_stale, netns, sh

pytestmark = pytest.mark.kernel

TOOLS = ("iptables-restore", "ip6tables-restore", "iptables", "ip6tables")


def _tools(version: int) -> list[str]:
    base = "iptables" if version == 4 else "ip6tables"
    tools = [f"{base}-restore"]
    if shutil.which(f"{base}-legacy-restore"):
        tools.append(f"{base}-legacy-restore")
    return tools


@pytest.fixture(scope="module")
def ns() -> Iterator[str]:
    require_kernel(*TOOLS)
    cleanup_stale()
    with netns("hookchk") as name:
        yield name


def kernel_restore(ns: str, tool: str, text: str) -> subprocess.CompletedProcess[str]:
    """Restore ``text`` with ``tool`` in ``ns``; then empty the tables it may have loaded."""
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, tool], input=text, capture_output=True, text=True, timeout=30
    )
    base = tool.removesuffix("-restore")
    for table in ("nat", "filter"):
        for flag in ("-F", "-X"):
            sh("ip", "netns", "exec", ns, base, "-t", table, flag, check=False)
    return proc


@pytest.mark.parametrize(("version", "text", "message"),
                         [pytest.param(c[1], c[2], c[4], id=c[0]) for c in REFUSED])  # fmt: skip
def test_kernel_refuses_as_the_emulator(ns: str, version: int, text: str, message: str) -> None:
    with pytest.raises(NetfilterError, match=message):
        load(text, version=version, strict=True)
    for tool in _tools(version):
        proc = kernel_restore(ns, tool, text)
        assert proc.returncode != 0, f"{tool} loaded it"


@pytest.mark.parametrize(("version", "text"), [pytest.param(c[1], c[2], id=c[0]) for c in ACCEPTED])
def test_kernel_loads_as_the_emulator(ns: str, version: int, text: str) -> None:
    load(text, version=version, strict=True)
    for tool in _tools(version):
        proc = kernel_restore(ns, tool, text)
        assert proc.returncode == 0, f"{tool}: {proc.stderr.strip()}"


@pytest.mark.parametrize(("version", "rule", "refused"), ICMP_MATCH)
def test_icmp_match_protocol_as_the_kernel(ns: str, version: int, rule: str, refused: bool) -> None:
    text = filt(rule)
    try:
        load(text, version=version, strict=True)
        emulated = False
    except NetfilterError:
        emulated = True
    assert emulated == refused
    for tool in _tools(version):
        proc = kernel_restore(ns, tool, text)
        assert (proc.returncode != 0) == refused, f"{tool}: {proc.stderr.strip()}"


@pytest.mark.parametrize("version", [4, 6])
@pytest.mark.parametrize(("given", "saved"), PROTO_SAVED)
def test_protocol_saved_as_the_tools(ns: str, version: int, given: str, saved: str) -> None:
    text = filt(f"-A INPUT -p {given} -j ACCEPT")
    base = "iptables" if version == 4 else "ip6tables"
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, f"{base}-restore"], input=text, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    kernel = sh("ip", "netns", "exec", ns, f"{base}-save", "-t", "filter").stdout
    sh("ip", "netns", "exec", ns, base, "-t", "filter", "-F")
    ours = save(load(text, version=version, strict=True))
    rules = [line for line in kernel.splitlines() if line.startswith("-A")]
    assert (
        rules
        == [line for line in ours.splitlines() if line.startswith("-A")]
        == [f"-A INPUT -p {saved} -j ACCEPT"]
    )
