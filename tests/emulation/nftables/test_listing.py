"""``nft list ruleset`` as nft 1.0.6 prints it (the kernel comparison is tests/kernel)."""

from __future__ import annotations

from emulation.nftables import canonical, list_ruleset, load
from emulation.nftables.listing import format_priority, format_time
from emulation.nftables.model import NftHook
from tests.emulation.nftables.rulesets import KUBE_PROXY_BLOCK, KUBE_PROXY_COMMANDS, MISC


def test_listing_round_trips() -> None:
    """Loading a listing and listing it again gives the same text."""
    for text in (KUBE_PROXY_BLOCK, KUBE_PROXY_COMMANDS, MISC):
        first = list_ruleset(load(text))
        assert list_ruleset(load(first)) == first


def test_listing_normalises_statements_as_nft() -> None:
    """Marks print as 0x%08x with ``meta``, operators as symbols, counters with values."""
    listing = list_ruleset(load(KUBE_PROXY_BLOCK))
    assert "\t\tmeta mark set meta mark | 0x00004000\n" in listing
    assert "\t\tmeta mark & 0x00004000 == 0x00000000 return\n" in listing
    assert "\t\tip daddr 172.30.0.0/16 drop comment" in listing  # a one-element set loses braces
    assert "meta l4proto tcp counter packets 0 bytes 0 dnat to 10.180.0.1:80" in listing
    assert "\t\ttype filter hook prerouting priority dstnat - 10; policy accept;\n" in listing


def test_listing_wraps_elements_as_nft() -> None:
    """Two addresses a line; a concatenation one a line."""
    listing = list_ruleset(load(KUBE_PROXY_BLOCK))
    assert "elements = { 172.30.0.41, 172.30.0.42,\n\t\t\t     172.30.0.43 }" in listing
    assert ": goto service-ULMVA6XW-ns1/svc1/tcp/p80,\n\t\t\t     172.30.0.42 . udp" in listing


def test_priorities_print_by_name_only_where_the_hook_allows() -> None:
    """``dstnat`` only at prerouting, ``srcnat`` only at postrouting (prio2str)."""
    assert format_priority(-100, NftHook.OUTPUT) == "-100"
    assert format_priority(-100, NftHook.PREROUTING) == "dstnat"
    assert format_priority(-110, NftHook.OUTPUT) == "-110"
    assert format_priority(10, NftHook.INPUT) == "filter + 10"
    assert format_priority(-150, NftHook.FORWARD) == "mangle"


def test_times_print_as_nft() -> None:
    """10800 s is ``3h``; 90 s is ``1m30s``."""
    assert (format_time(10800), format_time(90), format_time(0.5)) == ("3h", "1m30s", "500ms")


def test_dynamic_set_gets_default_size_and_interval_set_sorts() -> None:
    """A dynamic set lists ``size 65535``; interval elements are listed in order."""
    listing = list_ruleset(load(MISC))
    assert "\t\tsize 65535\n\t\tflags dynamic,timeout\n\t\ttimeout 3h\n" in listing
    assert "elements = { 10.0.0.0/8, 192.168.1.1,\n\t\t\t     192.168.2.0-192.168.2.9 }" in listing


def test_canonical_ignores_hash_order() -> None:
    """Two listings differing only in element order compare equal after canonical()."""
    a = "\t\telements = { 1.1.1.1, 1.1.1.2,\n\t\t\t     1.1.1.3 }"
    b = "\t\telements = { 1.1.1.3, 1.1.1.1,\n\t\t\t     1.1.1.2 }"
    assert canonical(a) == canonical(b)
