"""The bytes of Cilium's map keys and values, against struct layouts written out by hand."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kproxy.errors import InvalidArgument
from kproxy.model import IPFamily
from kproxy.modes.ebpf.layout import (
    MAP_SPECS,
    AffinityKey,
    AffinityMatchKey,
    AffinityValue,
    Backend,
    BackendState,
    LBAlgorithm,
    MapType,
    ReverseNat,
    ReverseNatKey,
    Scope,
    ServiceFlag,
    ServiceFlag2,
    ServiceKey,
    ServiceValue,
    SockRevNatEntry,
    SockRevNatKey,
    SourceRangeKey,
    backend_key,
    maglev_inner_pack,
    maglev_inner_unpack,
    map_spec,
)

pytestmark = pytest.mark.skipif(sys.byteorder != "little", reason="expected bytes are written for x86")


def test_lb4_key_has_network_order_address_and_port_and_host_order_slot() -> None:
    """lb4_key: be32 address, be16 dport, host u16 slot, proto, scope, two pad bytes."""
    key = ServiceKey(address="10.96.0.10", dport=80, backend_slot=3, proto=6, scope=Scope.INTERNAL)
    assert key.pack() == bytes([10, 96, 0, 10, 0, 80, 3, 0, 6, 1, 0, 0])
    assert ServiceKey.unpack(key.pack()) == key


def test_lb6_key_is_24_bytes() -> None:
    """lb6_key: a 16-byte address, then the same 8 bytes as lb4_key."""
    key = ServiceKey(address="fd00::a", dport=443, backend_slot=0, proto=17)
    raw = key.pack()
    assert len(raw) == 24
    assert raw[:16] == bytes.fromhex("fd00000000000000000000000000000a")
    assert raw[16:] == bytes([1, 187, 0, 0, 17, 0, 0, 0])
    assert ServiceKey.unpack(raw) == key


def test_master_value_keeps_algorithm_in_the_top_byte_and_rev_nat_in_network_order() -> None:
    """lb4_service master: u32 (alg<<24 | timeout), u16 count, be16 rev_nat, flags, flags2, u16 qcount."""
    value = ServiceValue.master_entry(
        count=3, qcount=1, rev_nat_index=0x0102, flags=ServiceFlag.AFFINITY | ServiceFlag.ROUTABLE,
        flags2=ServiceFlag2.TWO_SCOPES, affinity_timeout_s=10800, algorithm=LBAlgorithm.MAGLEV)
    raw = value.pack()
    assert raw == bytes([0x30, 0x2A, 0x00, 0x02, 3, 0, 0x01, 0x02, 0x50, 0x20, 1, 0])
    back = ServiceValue.unpack(raw)
    assert back == value
    assert (back.affinity_timeout, back.algorithm) == (10800, LBAlgorithm.MAGLEV)


def test_slot_value_holds_the_backend_id_in_host_order() -> None:
    """A slot entry's union word is the backend id, little-endian on this machine."""
    raw = ServiceValue(backend_id=0x01020304, rev_nat_index=7).pack()
    assert raw[:4] == bytes([4, 3, 2, 1])
    assert raw[6:8] == bytes([0, 7])


def test_affinity_timeout_over_24_bits_is_refused() -> None:
    """The timeout shares its word with the algorithm: 2**24 seconds does not fit."""
    with pytest.raises(InvalidArgument, match="affinity_timeout_s"):
        ServiceValue.master_entry(count=0, qcount=0, rev_nat_index=1, flags=ServiceFlag(0),
                                  flags2=ServiceFlag2(0), affinity_timeout_s=1 << 24)


def test_backend_values_of_both_families() -> None:
    """lb4_backend: be32 address, be16 port, proto, state, u16 cluster_id, zone, pad."""
    be = Backend(address="10.244.1.5", port=8080, proto=6, state=BackendState.TERMINATING,
                 cluster_id=2, zone=5)
    assert be.pack() == bytes([10, 244, 1, 5, 0x1F, 0x90, 6, 1, 2, 0, 5, 0])
    assert Backend.unpack(be.pack()) == be
    be6 = Backend(address="fd00::5", port=80, state=BackendState.MAINTENANCE)
    assert len(be6.pack()) == 24 and Backend.unpack(be6.pack()) == be6
    assert backend_key(258) == bytes([2, 1, 0, 0])


def test_reverse_nat_key_and_value() -> None:
    """The reverse-NAT key is a be16 index; lb4_reverse_nat is packed to 6 bytes."""
    assert ReverseNatKey(rev_nat_index=1).pack() == b"\x00\x01"
    assert ReverseNat(address="10.96.0.10", port=53).pack() == bytes([10, 96, 0, 10, 0, 53])
    assert len(ReverseNat(address="fd00::1", port=53).pack()) == 18


def test_affinity_key_by_address_and_by_netns_cookie() -> None:
    """lb4_affinity_key: an 8-byte union, be16 rev_nat_id, the cookie bit, pad to 16 bytes."""
    by_ip = AffinityKey(family=IPFamily.IPv4, rev_nat_id=5, client_ip="192.0.2.1")
    assert by_ip.pack() == bytes([192, 0, 2, 1, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0])
    by_cookie = AffinityKey(family=IPFamily.IPv4, rev_nat_id=5, netns_cookie=0x0807060504030201)
    assert by_cookie.pack() == bytes([1, 2, 3, 4, 5, 6, 7, 8, 0, 5, 1, 0, 0, 0, 0, 0])
    assert AffinityKey.unpack(by_cookie.pack()) == by_cookie
    six = AffinityKey(family=IPFamily.IPv6, rev_nat_id=5, client_ip="2001:db8::1")
    assert len(six.pack()) == 24 and AffinityKey.unpack(six.pack()) == six
    with pytest.raises(InvalidArgument):
        AffinityKey(family=IPFamily.IPv6, rev_nat_id=5, client_ip="192.0.2.1").pack()


def test_affinity_value_and_match_key() -> None:
    """lb_affinity_val: u64 last_used, u32 backend_id, pad; lb_affinity_match: u32, be16, pad."""
    assert AffinityValue(last_used=1, backend_id=4).pack() == bytes([1] + [0] * 7 + [4, 0, 0, 0] + [0] * 4)
    assert AffinityMatchKey(backend_id=4, rev_nat_id=1).pack() == bytes([4, 0, 0, 0, 0, 1, 0, 0])


def test_source_range_key_adds_the_static_32_bits_to_the_prefix() -> None:
    """lb4_src_range_key: u32 prefixlen (32 + CIDR bits), be16 rev_nat_id, pad, be32 address."""
    key = SourceRangeKey(rev_nat_id=3, address="192.0.2.0", prefix=24)
    assert key.pack() == bytes([56, 0, 0, 0, 0, 3, 0, 0, 192, 0, 2, 0])
    assert SourceRangeKey.unpack(key.pack()) == key
    with pytest.raises(InvalidArgument, match="prefix"):
        SourceRangeKey(rev_nat_id=3, address="192.0.2.0", prefix=33).pack()


def test_socket_reverse_nat_tuple_and_entry() -> None:
    """ipv4_revnat_tuple is 16 bytes, ipv4_revnat_entry 8; their IPv6 twins 28 and 20."""
    key = SockRevNatKey(cookie=9, address="10.244.1.5", port=80)
    assert key.pack() == bytes([9] + [0] * 7 + [10, 244, 1, 5, 0, 80, 0, 0])
    entry = SockRevNatEntry(address="10.96.0.10", port=80, rev_nat_index=1)
    assert entry.pack() == bytes([10, 96, 0, 10, 0, 80, 0, 1])
    assert len(SockRevNatKey(cookie=1, address="::1", port=1).pack()) == 28
    assert len(SockRevNatEntry(address="::1", port=1, rev_nat_index=1).pack()) == 20


def test_unpack_refuses_a_buffer_of_the_wrong_size() -> None:
    """A key of 13 bytes is neither lb4_key nor lb6_key."""
    with pytest.raises(InvalidArgument, match="12 or 24"):
        ServiceKey.unpack(bytes(13))


@given(st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=300))
def test_maglev_inner_value_round_trips(table: list[int]) -> None:
    """The inner value is M host-order u32 backend ids."""
    assert maglev_inner_unpack(maglev_inner_pack(table)) == tuple(table)


def test_map_specs_match_the_struct_sizes() -> None:
    """Every spec's key and value sizes are those of the structs packed above."""
    services = map_spec("services_v2", IPFamily.IPv4)
    assert (services.key_size, services.value_size, services.type) == (12, 12, MapType.HASH)
    assert map_spec("services_v2", IPFamily.IPv6).key_size == 24
    assert map_spec("backends_v3", IPFamily.IPv6).value_size == 24
    assert map_spec("affinity", IPFamily.IPv4).type is MapType.LRU_HASH
    assert map_spec("affinity", IPFamily.IPv6).key_size == 24
    assert map_spec("source_range", IPFamily.IPv4).type is MapType.LPM_TRIE
    maglev = map_spec("maglev", IPFamily.IPv4, table_size=1021)
    assert maglev.inner is not None and maglev.inner.value_size == 4 * 1021
    assert MAP_SPECS["cilium_lb_affinity_match"].key_size == 8
    assert all(spec.max_entries > 0 and len(spec.kernel_name) <= 15 for spec in MAP_SPECS.values())


@given(st.ip_addresses().map(str), st.integers(0, 65535), st.integers(0, 65535),
       st.sampled_from([0, 6, 17, 132]), st.sampled_from(list(Scope)))
def test_service_key_round_trips(address: str, dport: int, slot: int, proto: int, scope: Scope) -> None:
    """unpack(pack(k)) == k for any address of either family."""
    key = ServiceKey(address=address, dport=dport, backend_slot=slot, proto=proto, scope=scope)
    assert ServiceKey.unpack(key.pack()) == key
