"""``nft list ruleset`` after ``nft -f`` in a namespace equals the emulator's listing."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulation.nftables import canonical, list_ruleset, load
from tests.conftest import require_kernel
from tests.emulation.nftables.rulesets import KUBE_PROXY_BLOCK, KUBE_PROXY_COMMANDS, MAPS, MISC
from tests.kernel.netns import cleanup_stale, netns, sh

pytestmark = pytest.mark.kernel


@pytest.fixture
def ns() -> Iterator[str]:
    """A fresh network namespace (deleted after)."""
    require_kernel("nft")
    cleanup_stale()
    with netns("nftlist") as name:
        yield name


def nft_load(ns: str, text: str) -> str:
    """Load ``text`` with ``nft -f`` in ``ns``; the kernel's ``nft list ruleset``."""
    with tempfile.NamedTemporaryFile("w", suffix=".nft") as f:
        f.write(text)
        f.flush()
        sh("ip", "netns", "exec", ns, "nft", "-f", f.name)
    return sh("ip", "netns", "exec", ns, "nft", "list", "ruleset").stdout


@pytest.mark.parametrize("name", ["KUBE_PROXY_BLOCK", "KUBE_PROXY_COMMANDS", "MISC", "MAPS"])
def test_listing_equals_the_kernels(ns: str, name: str) -> None:
    """The emulator lists a loaded ruleset as the kernel does (set elements sorted)."""
    texts = {"KUBE_PROXY_BLOCK": KUBE_PROXY_BLOCK, "KUBE_PROXY_COMMANDS": KUBE_PROXY_COMMANDS, "MISC": MISC}
    text = (texts | {"MAPS": MAPS})[name]
    kernel = nft_load(ns, text)
    assert canonical(list_ruleset(load(text))) == canonical(kernel)
    assert canonical(list_ruleset(load(kernel))) == canonical(kernel)


def test_command_form_with_a_forward_reference_fails_in_the_kernel_and_the_emulator(ns: str) -> None:
    """nft 1.0.6 refuses a rule that jumps to a chain added later; so does the emulator."""
    text = "add table ip t\nadd chain ip t a\nadd rule ip t a jump b\nadd chain ip t b\n"
    with pytest.raises(RuntimeError):
        nft_load(ns, text)
    with pytest.raises(ValueError, match="line 3"):
        load(text)


NODE_RULESET = Path(__file__).resolve().parents[1] / "emulation" / "data" / "node-ruleset.nft"


def test_node_ruleset_with_a_firewall_table_loads_and_lists_as_the_kernel(ns: str) -> None:
    """The node ruleset kproxy trace tests use (kube-proxy's table beside a firewalld-like inet table, with
    fib saddr . iif oif and ipv6-icmp) loads strictly in the emulator and lists as the kernel lists it."""
    text = NODE_RULESET.read_text()
    kernel = nft_load(ns, text)
    assert canonical(list_ruleset(load(text))) == canonical(kernel)
    listed = "".join(line + "\n" for line in text.splitlines() if not line.startswith("#"))
    assert canonical(kernel) == canonical(listed)  # the file is what this kernel listed


LOG = """\
table ip t {
\tchain c {
\t\ttype filter hook input priority filter; policy accept;
\t\tlog level info prefix "a b " accept
\t\tlog
\t\tlog group 2 prefix "g"
\t\tlog level warn
\t\tlog group 3 snaplen 64 queue-threshold 2
\t\ttcp dport 22 log prefix "ssh: " counter accept
\t}
}
"""


def test_log_statements_list_as_the_kernel(ns: str) -> None:
    """`log` with prefix, level, group and snaplen loads and lists in nft's order (level warn left out)."""
    kernel = nft_load(ns, LOG)
    assert canonical(list_ruleset(load(LOG))) == canonical(kernel)
