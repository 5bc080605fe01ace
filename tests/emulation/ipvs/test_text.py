# ruff: noqa: E501, W291  (ipvsadm rows are kept whole, trailing spaces included, as ipvsadm prints them)
"""ipvsadm-save -n and ipvsadm -Ln text: exact format, list order, and round trips."""

from __future__ import annotations

import pytest

from emulation.ipvs import IpvsError, format_list, format_rules, load_list, load_rules

SAVE = """-A -t 10.96.0.1:443 -s rr
-a -t 10.96.0.1:443 -r 10.244.1.2:6443 -m -w 1
-a -t 10.96.0.1:443 -r 10.244.2.3:6443 -m -w 0
-A -u 10.96.0.10:53 -s sh -b sh-fallback,sh-port -p 10800
-a -u 10.96.0.10:53 -r 10.244.1.5:53 -m -w 1
"""

LISTING = """IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.0.1:443 rr
  -> 10.244.2.3:6443              Masq    0      0          0         
  -> 10.244.1.2:6443              Masq    1      0          0         
UDP  10.96.0.10:53 sh (sh-fallback,sh-port) persistent 10800
  -> 10.244.1.5:53                Masq    1      0          0         
"""


def test_restore_adds_each_server_to_the_head() -> None:
    """ipvsadm-restore replays -a lines in turn; list_add_rcu puts the last one first."""
    t = load_rules(SAVE)
    assert [d.label for d in t.services()[0].dests] == ["10.244.2.3:6443", "10.244.1.2:6443"]


def test_nosort_listing_is_exact() -> None:
    """-Ln --nosort prints kernel list order with ipvsadm's column widths and trailing spaces."""
    assert format_list(load_rules(SAVE), nosort=True) == LISTING


def test_sorted_listing_orders_by_address() -> None:
    """Default -Ln sorts servers with ipvs_cmp_dests (address, then port)."""
    lines = format_list(load_rules(SAVE)).splitlines()
    assert lines[4].split()[1] == "10.244.1.2:6443"


def test_save_round_trip() -> None:
    """format_rules(load_rules(save)) is the same save text (sorted, as ipvsadm-save -n prints it)."""
    assert format_rules(load_rules(SAVE)) == SAVE


def test_nosort_listing_round_trip_keeps_kernel_order() -> None:
    """Loading -Ln --nosort adds rows bottom-up, so the listing reproduces itself and the list order."""
    t = load_list(LISTING)
    assert format_list(t, nosort=True) == LISTING


def test_listing_keeps_connection_counts() -> None:
    """ActiveConn/InActConn of a dump become the servers' counters (lc/wlc read them)."""
    text = LISTING.replace("Masq    1      0          0         \nUDP", "Masq    1      7          3         \nUDP")
    d = load_list(text).services()[0].dests[1]
    assert (d.activeconns, d.inactconns) == (7, 3)


def test_weight_zero_in_a_dump_is_added_at_weight_zero() -> None:
    """A dump has no history: a weight-0 row gets last_weight 0, so mh gives it no slot."""
    text = "TCP  10.0.0.1:80 mh\n  -> 10.1.0.1:80 Masq 0 0 0\n  -> 10.1.0.2:80 Masq 1 0 0\n"
    svc = load_list(text).services()[0]
    gone = svc.dests[0]
    assert gone.last_weight == 0
    assert all(d is not gone for d in svc.scheduler.table)  # type: ignore[attr-defined]


def test_signed_address_compare_sorts_192_before_10() -> None:
    """libipvs compares ntohl(a) - ntohl(b) as int: 0x0A.. - 0xC0.. wraps positive, so 192.168 sorts first."""
    t = load_rules("-A -t 10.0.0.1:80 -s rr\n-a -t 10.0.0.1:80 -r 10.1.1.1:80 -m\n-a -t 10.0.0.1:80 -r 192.168.1.1:80 -m\n")
    assert [line.split()[1] for line in format_list(t).splitlines()[4:]] == ["192.168.1.1:80", "10.1.1.1:80"]


def test_persistence_mask_and_ipv6_format() -> None:
    """Netmask prints as `mask`/`-M`; IPv6 addresses are bracketed."""
    t = load_rules("-A -t [fd00::1]:80 -s wlc -p 60 -M 64\n-a -t [fd00::1]:80 -r [fd00::2]:80 -g -w 2\n")
    assert format_rules(t) == "-A -t [fd00::1]:80 -s wlc -p 60 -M 64\n-a -t [fd00::1]:80 -r [fd00::2]:80 -g -w 2\n"
    assert "TCP  [fd00::1]:80 wlc persistent 60 mask 64\n  -> [fd00::2]:80" in format_list(t)


def test_fwmark_service_round_trip() -> None:
    """-f services list as `FWM  N` and save as `-A -f N`."""
    text = "-A -f 5 -s rr\n-a -f 5 -r 10.1.0.1:0 -m -w 1\n"
    t = load_rules(text)
    assert format_rules(t) == text
    assert "FWM  5 rr\n" in format_list(t)


def test_restore_error_names_the_line() -> None:
    """A bad command fails with the line number and text."""
    with pytest.raises(IpvsError, match=r"line 2: .*--frobnicate"):
        load_rules("-A -t 10.0.0.1:80 -s rr\n-a -t 10.0.0.1:80 --frobnicate\n")


def test_duplicate_server_is_eexist() -> None:
    """ip_vs_add_dest refuses a server that is already in the list."""
    with pytest.raises(IpvsError, match="EEXIST"):
        load_rules("-A -t 10.0.0.1:80 -s rr\n-a -t 10.0.0.1:80 -r 10.1.0.1:80\n-a -t 10.0.0.1:80 -r 10.1.0.1:80\n")


def test_unmodelled_scheduler_is_refused() -> None:
    """lblc is not modelled: loading it fails loudly instead of scheduling wrongly."""
    with pytest.raises(IpvsError, match="lblc"):
        load_rules("-A -t 10.0.0.1:80 -s lblc\n")
