"""lc, wlc, sed, nq, fo and ovf against their ip_vs_*.c loops; list order is newest first."""

from __future__ import annotations

from tests.emulation.ipvs.helpers import dest, pick, service


def _load(svc, counts: dict[str, tuple[int, int]]) -> None:  # type: ignore[no-untyped-def]
    for addr, (active, inactive) in counts.items():
        d = dest(svc, addr)
        d.activeconns, d.inactconns = active, inactive


def test_lc_ties_go_to_the_head() -> None:
    """ip_vs_lc_schedule keeps the first least overhead (strict `doh < loh`): equal loads pick the newest."""
    svc = service("lc", [("10.0.0.1", 1), ("10.0.0.2", 1)])
    assert pick(svc) == "10.0.0.2"


def test_lc_overhead_weighs_active_256_times_inactive() -> None:
    """ip_vs_dest_conn_overhead = active<<8 + inactive: 1 active (256) loses to 255 inactive."""
    svc = service("lc", [("10.0.0.1", 1), ("10.0.0.2", 1)])
    _load(svc, {"10.0.0.2": (1, 0), "10.0.0.1": (0, 255)})
    assert pick(svc) == "10.0.0.1"


def test_lc_ignores_weights_but_skips_zero() -> None:
    """lc reads weight only to skip quiesced servers (`weight == 0`): weight 100 is no better than 1."""
    svc = service("lc", [("10.0.0.1", 100), ("10.0.0.2", 1), ("10.0.0.3", 0)])
    _load(svc, {"10.0.0.1": (1, 0)})
    assert pick(svc) == "10.0.0.2"


def test_wlc_divides_overhead_by_weight() -> None:
    """ip_vs_wlc_schedule: loh*w(d) > doh*w(least): 256/1 vs 512/3 -> the weight-3 server wins."""
    svc = service("wlc", [("10.0.0.1", 3), ("10.0.0.2", 1)])  # list .2, .1
    _load(svc, {"10.0.0.2": (1, 0), "10.0.0.1": (2, 0)})
    assert pick(svc) == "10.0.0.1"


def test_wlc_equal_ratio_keeps_the_earlier_server() -> None:
    """The strict `>` in ip_vs_wlc_schedule keeps `least` on a tie: 256*2 == 512*1."""
    svc = service("wlc", [("10.0.0.1", 2), ("10.0.0.2", 1)])  # list .2(w1), .1(w2)
    _load(svc, {"10.0.0.2": (1, 0), "10.0.0.1": (2, 0)})
    assert pick(svc) == "10.0.0.2"


def test_wlc_weight_zero_never_wins_the_second_stage() -> None:
    """In the nextstage loop a weight-0 server gives loh*0 > doh*w, always false."""
    svc = service("wlc", [("10.0.0.1", 0), ("10.0.0.2", 1)])
    _load(svc, {"10.0.0.2": (5, 0)})
    assert pick(svc) == "10.0.0.2"


def test_sed_counts_only_active_plus_one() -> None:
    """ip_vs_sed_dest_overhead = active + 1: inactive connections do not matter."""
    svc = service("sed", [("10.0.0.1", 1), ("10.0.0.2", 1)])
    _load(svc, {"10.0.0.2": (0, 50), "10.0.0.1": (1, 0)})
    assert pick(svc) == "10.0.0.2"


def test_sed_prefers_heavier_weight_when_loaded() -> None:
    """(1+1)/1 vs (1+1)/4: 2*4 > 2*1, so the weight-4 server wins."""
    svc = service("sed", [("10.0.0.1", 4), ("10.0.0.2", 1)])
    _load(svc, {"10.0.0.2": (1, 0), "10.0.0.1": (1, 0)})
    assert pick(svc) == "10.0.0.1"


def test_nq_returns_the_first_idle_server() -> None:
    """ip_vs_nq_schedule returns a server with activeconns == 0 at once, before comparing loads."""
    svc = service("nq", [("10.0.0.1", 1), ("10.0.0.2", 9), ("10.0.0.3", 1)])  # list .3, .2, .1
    _load(svc, {"10.0.0.3": (2, 0), "10.0.0.2": (1, 0)})
    assert pick(svc) == "10.0.0.1"


def test_nq_without_idle_falls_back_to_sed() -> None:
    """No idle server: (2+1)/1 vs (1+1)/9 picks the weight-9 one."""
    svc = service("nq", [("10.0.0.2", 9), ("10.0.0.3", 1)])
    _load(svc, {"10.0.0.3": (2, 0), "10.0.0.2": (1, 0)})
    assert pick(svc) == "10.0.0.2"


def test_fo_highest_weight_first_in_list_on_ties() -> None:
    """ip_vs_fo_schedule: `weight > hw` keeps the first of equal weights (the newest)."""
    svc = service("fo", [("10.0.0.1", 5), ("10.0.0.2", 5), ("10.0.0.3", 2)])
    assert pick(svc) == "10.0.0.2"


def test_fo_ignores_load() -> None:
    """fo reads no counters: the heaviest server takes everything."""
    svc = service("fo", [("10.0.0.1", 5), ("10.0.0.2", 1)])
    _load(svc, {"10.0.0.1": (1000, 1000)})
    assert pick(svc) == "10.0.0.1"


def test_ovf_allows_activeconns_equal_to_weight() -> None:
    """ip_vs_ovf_schedule skips only `activeconns > weight`: 2 active at weight 2 still qualifies."""
    svc = service("ovf", [("10.0.0.1", 1), ("10.0.0.2", 2)])
    _load(svc, {"10.0.0.2": (2, 0)})
    assert pick(svc) == "10.0.0.2"


def test_ovf_overflows_to_the_next_weight() -> None:
    """When the heaviest server has more active connections than its weight, the next one gets the flow."""
    svc = service("ovf", [("10.0.0.1", 1), ("10.0.0.2", 2)])
    _load(svc, {"10.0.0.2": (3, 0)})
    assert pick(svc) == "10.0.0.1"


def test_overloaded_servers_are_skipped_by_every_load_scheduler() -> None:
    """IP_VS_DEST_F_OVERLOAD excludes a server in lc, wlc, sed, nq, fo and ovf alike."""
    for name in ("lc", "wlc", "sed", "nq", "fo", "ovf"):
        svc = service(name, [("10.0.0.1", 1), ("10.0.0.2", 1)])
        dest(svc, "10.0.0.2").overloaded = True
        assert pick(svc) == "10.0.0.1", name
