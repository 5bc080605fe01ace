"""rr and wrr replayed against ip_vs_rr.c and ip_vs_wrr.c, expectations derived by hand."""

from __future__ import annotations

from dataclasses import replace

from emulation.ipvs import DestSpec, parse_address
from tests.emulation.ipvs.helpers import picks, service


def test_rr_walks_the_list_head_first() -> None:
    """ip_vs_rr_schedule from the head: A, B, C added (list C, B, A) give C, B, A, C (list_add_rcu heads)."""
    svc = service("rr", [("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)])
    assert picks(svc, 4) == ["10.0.0.3", "10.0.0.2", "10.0.0.1", "10.0.0.3"]


def test_rr_skips_weight_zero_but_keeps_its_place() -> None:
    """The `weight > 0` test in ip_vs_rr_schedule's loop skips a quiesced server on every pass."""
    svc = service("rr", [("10.0.0.1", 1), ("10.0.0.2", 0), ("10.0.0.3", 1)])
    assert picks(svc, 4) == ["10.0.0.3", "10.0.0.1", "10.0.0.3", "10.0.0.1"]


def test_rr_deleting_the_cursor_moves_it_to_the_predecessor() -> None:
    """ip_vs_rr_del_dest sets sched_data to p->next->prev, so after C, B and deleting B, A follows C."""
    svc = service("rr", [("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)])
    assert picks(svc, 2) == ["10.0.0.3", "10.0.0.2"]
    svc.del_dest((*parse_address("10.0.0.2"), 8080))
    assert picks(svc, 3) == ["10.0.0.1", "10.0.0.3", "10.0.0.1"]


def test_rr_new_server_is_reached_when_the_walk_wraps() -> None:
    """rr has no add_dest: a server added at the head is picked after the walk passes the tail."""
    svc = service("rr", [("10.0.0.1", 1), ("10.0.0.2", 1)])
    assert picks(svc, 1) == ["10.0.0.2"]
    svc.add_dest(DestSpec(addr=parse_address("10.0.0.9"), port=8080))
    assert picks(svc, 3) == ["10.0.0.1", "10.0.0.9", "10.0.0.2"]


def test_rr_with_no_eligible_server_returns_none() -> None:
    """Both passes of ip_vs_rr_schedule find nothing when every weight is 0."""
    svc = service("rr", [("10.0.0.1", 0), ("10.0.0.2", 0)])
    assert picks(svc, 1) == [None]


def test_wrr_incremental_adds_start_with_the_first_weights_cw() -> None:
    """ip_vs_wrr_dest_changed: C2 alone has di=2, mw=1, so cw=1; B3 and A4 keep it (cw <= mw, di=1).

    The first pass (cw=1) gives A B C; then cw wraps to mw=4: A; cw=3: A B; cw=2: A B C.
    """
    svc = service("wrr", [("10.0.0.3", 2), ("10.0.0.2", 3), ("10.0.0.1", 4)])  # list A4, B3, C2
    a, b, c = "10.0.0.1", "10.0.0.2", "10.0.0.3"
    assert picks(svc, 10) == [a, b, c, a, a, b, a, b, c, a]


def test_wrr_weights_4_3_2_after_init_give_the_kernel_sequence() -> None:
    """ip_vs_wrr_init_svc (scheduler switched with -E) sets cw=mw=4: passes 4,3,2,1 give A A B A B C A B C."""
    svc = service("wrr", [("10.0.0.3", 2), ("10.0.0.2", 3), ("10.0.0.1", 4)])
    svc.edit(replace(svc.spec, scheduler="rr"))
    svc.edit(replace(svc.spec, scheduler="wrr"))
    a, b, c = "10.0.0.1", "10.0.0.2", "10.0.0.3"
    assert picks(svc, 10) == [a, a, b, a, b, c, a, b, c, a]


def test_wrr_uses_the_gcd_step() -> None:
    """Weights A2, B4, C6 after init: di=2, mw=6-1=5; passes cw=5, 3, 1 give C, B C, A B C, then C."""
    svc = service("wrr", [("10.0.0.3", 6), ("10.0.0.2", 4), ("10.0.0.1", 2)])  # list A2, B4, C6
    svc.edit(replace(svc.spec, scheduler="rr"))
    svc.edit(replace(svc.spec, scheduler="wrr"))
    a, b, c = "10.0.0.1", "10.0.0.2", "10.0.0.3"
    assert picks(svc, 7) == [c, b, c, a, b, c, c]


def test_wrr_weight_change_resets_the_cursor_to_the_head() -> None:
    """ip_vs_wrr_dest_changed sets cl to the head; with cw unchanged the next pick restarts the pass."""
    svc = service("wrr", [("10.0.0.2", 1), ("10.0.0.1", 1)])  # list A, B
    assert picks(svc, 1) == ["10.0.0.1"]
    svc.edit_dest(DestSpec(addr=parse_address("10.0.0.2"), port=8080, weight=1))
    assert picks(svc, 2) == ["10.0.0.1", "10.0.0.2"]


def test_wrr_all_weights_zero_is_no_destination() -> None:
    """mw == 0 makes ip_vs_wrr_schedule bail out before walking the list."""
    svc = service("wrr", [("10.0.0.1", 0)])
    assert picks(svc, 1) == [None]
