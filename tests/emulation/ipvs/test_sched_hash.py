"""sh, dh and mh: which client lands on which server, and what add, delete and weight 0 do."""

from __future__ import annotations

from emulation.ipvs import MH_FALLBACK, MH_PORT, SH_FALLBACK, SH_PORT, DestSpec, parse_address
from tests.emulation.ipvs.helpers import dest, ip, pick, service

THREE = [("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)]  # list .3, .2, .1


def test_sh_bucket_is_hash_32_of_the_source() -> None:
    """ip_vs_sh_hashkey: hash_32(0x0A000005, 8) = 174, hash_32(0x0A000105, 8) = 119."""
    svc = service("sh", THREE)
    assert svc.scheduler.bucket_of(4, ip("10.0.0.5")) == 174  # type: ignore[attr-defined]
    assert svc.scheduler.bucket_of(4, ip("10.0.1.5")) == 119  # type: ignore[attr-defined]


def test_sh_maps_clients_through_round_robin_buckets() -> None:
    """ip_vs_sh_reassign with weights 1: bucket i holds list[i % 3]; 174 % 3 = 0 -> .3, 119 % 3 = 2 -> .1."""
    svc = service("sh", THREE)
    assert pick(svc, "10.0.0.5") == "10.0.0.3"
    assert pick(svc, "10.0.1.5") == "10.0.0.1"


def test_sh_weights_replicate_buckets() -> None:
    """`++d_count >= weight`: weights 2, 1 (list A2, B1) fill buckets A A B A A B ...; 174 % 3 = 0 -> A."""
    svc = service("sh", [("10.0.0.2", 1), ("10.0.0.1", 2)])
    sched = svc.scheduler
    assert [d.label for d in sched.buckets[:6]] == ["10.0.0.1:8080"] * 2 + ["10.0.0.2:8080"] + [  # type: ignore[attr-defined]
        "10.0.0.1:8080"
    ] * 2 + ["10.0.0.2:8080"]
    assert pick(svc, "10.0.0.5") == "10.0.0.1"


def test_sh_weight_zero_keeps_layout_and_refuses_its_clients() -> None:
    """A weight-0 server still takes one bucket, so layout is unchanged; its clients get no server."""
    svc = service("sh", THREE)
    before = list(svc.scheduler.buckets)  # type: ignore[attr-defined]
    svc.edit_dest(DestSpec(addr=parse_address("10.0.0.3"), port=8080, weight=0))
    assert svc.scheduler.buckets == before  # type: ignore[attr-defined]
    assert pick(svc, "10.0.0.5") is None
    assert pick(svc, "10.0.1.5") == "10.0.0.1"


def test_sh_fallback_probes_rehashed_buckets() -> None:
    """ip_vs_sh_get_fallback: bucket 174 is quiesced; offset 0 probes (174 + 174) & 255 = 92 -> .1."""
    svc = service("sh", THREE, flags=SH_FALLBACK)
    svc.edit_dest(DestSpec(addr=parse_address("10.0.0.3"), port=8080, weight=0))
    assert pick(svc, "10.0.0.5") == "10.0.0.1"


def test_sh_port_adds_the_source_port() -> None:
    """sh-port hashes ntohs(sport) + addr: port 40000 -> bucket 82 (% 3 = 1 -> .2), 40001 -> 180 (-> .3)."""
    svc = service("sh", THREE, flags=SH_PORT)
    assert pick(svc, "10.0.0.5", 40000) == "10.0.0.2"
    assert pick(svc, "10.0.0.5", 40001) == "10.0.0.3"


def test_sh_delete_reshuffles_buckets() -> None:
    """Deleting a server rebuilds the table from the shorter list: 174 % 2 = 0 -> new head .2."""
    svc = service("sh", THREE)
    svc.del_dest((*parse_address("10.0.0.3"), 8080))
    assert pick(svc, "10.0.0.5") == "10.0.0.2"


def test_dh_hashes_the_destination_so_one_vip_has_one_server() -> None:
    """ip_vs_dh: hash_32(10.96.0.1, 8) = 130, 130 % 3 = 1 -> list[1] = .2, for every client."""
    svc = service("dh", THREE)
    assert {pick(svc, f"10.0.{i}.5") for i in range(20)} == {"10.0.0.2"}


def test_dh_ignores_weights_in_its_table_but_refuses_weight_zero() -> None:
    """ip_vs_dh_reassign gives one bucket per server regardless of weight; weight 0 -> no destination."""
    svc = service("dh", [("10.0.0.1", 1), ("10.0.0.2", 50), ("10.0.0.3", 1)])
    assert pick(svc) == "10.0.0.2"
    svc.edit_dest(DestSpec(addr=parse_address("10.0.0.2"), port=8080, weight=0))
    assert pick(svc) is None


MH = [("10.244.3.4", 1), ("10.244.2.3", 1), ("10.244.1.2", 1)]  # list 1.2, 2.3, 3.4


def _mh(flags: int = 0):  # type: ignore[no-untyped-def]
    svc = service("mh", MH, flags=flags)
    for d in svc.dests:
        d.spec = DestSpec(addr=d.spec.addr, port=8080, weight=d.weight)
    return svc


def test_mh_table_matches_the_worked_example() -> None:
    """ip_vs_mh_permutate/populate, M=4093: first slots [2,1,1,2,2,2,0,1,0,2,2,1], shares 1365/1364/1364."""
    svc = _mh()
    table = svc.scheduler.table
    index = {id(d): i for i, d in enumerate(svc.dests)}
    assert len(table) == 4093
    assert [index[id(d)] for d in table[:12]] == [2, 1, 1, 2, 2, 2, 0, 1, 0, 2, 2, 1]
    assert sorted(sum(1 for d in table if d is x) for x in svc.dests) == [1364, 1364, 1365]


def test_mh_maps_client_by_siphash_slot() -> None:
    """hsiphash(0x0A000005) % 4093 = 3620 -> 10.244.3.4; mh-port with sport 40000: slot 3633 -> 2.3."""
    assert pick(_mh(), "10.0.0.5", 40000) == "10.244.3.4"
    assert pick(_mh(MH_PORT), "10.0.0.5", 40000) == "10.244.2.3"


def test_mh_weight_zero_keeps_the_table_and_refuses() -> None:
    """Weight 0 leaves last_weight, so the table is unchanged and ip_vs_mh_get returns NULL for its slots."""
    svc = _mh()
    before = list(svc.scheduler.table)
    svc.edit_dest(DestSpec(addr=parse_address("10.244.3.4"), port=8080, weight=0))
    assert svc.scheduler.table == before
    assert pick(svc, "10.0.0.5") is None


def test_mh_fallback_finds_another_server() -> None:
    """ip_vs_mh_get_fallback rehashes with growing offsets until it meets an available server."""
    svc = _mh(MH_FALLBACK)
    svc.edit_dest(DestSpec(addr=parse_address("10.244.3.4"), port=8080, weight=0))
    assert pick(svc, "10.0.0.5") in {"10.244.1.2", "10.244.2.3"}


def test_mh_server_added_at_weight_zero_takes_no_slot() -> None:
    """last_weight 0 gives turns 0: `Ignore added server with zero weight` in ip_vs_mh_populate."""
    svc = service("mh", [("10.244.1.2", 1), ("10.244.9.9", 0)])
    assert all(d is not dest(svc, "10.244.9.9") for d in svc.scheduler.table)  # type: ignore[attr-defined]


def test_mh_delete_disturbs_few_other_clients() -> None:
    """Maglev's point: removing one of three servers moves almost no slot held by the other two."""
    svc = _mh()
    before = list(svc.scheduler.table)
    gone = dest(svc, "10.244.3.4")
    svc.del_dest(gone.spec.key)
    after = svc.scheduler.table
    kept = [i for i, d in enumerate(before) if d is not gone]
    moved = sum(1 for i in kept if after[i] is not before[i])
    assert moved / len(kept) < 0.05
