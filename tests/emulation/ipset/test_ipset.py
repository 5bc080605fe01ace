"""ipset types, membership as -m set tests it, and ipset save/restore text."""

from __future__ import annotations

import pytest

from emulation.ipset import IpsetError, IpsetTable, format_save, load_save

SAVE = """create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
add KUBE-CLUSTER-IP 10.96.0.10,udp:53
create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
add KUBE-LOOP-BACK 10.244.1.2,tcp:8080,10.244.1.2
create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536
add KUBE-LOAD-BALANCER-SOURCE-CIDR 1.2.3.4,tcp:80,192.168.0.0/16
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
add KUBE-NODE-PORT-TCP 30080
create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536 comment
add KUBE-IPVS-IPS 10.96.0.1 comment "default/kubernetes"
create NETS hash:net family inet hashsize 1024 maxelem 65536
add NETS 10.0.0.0/8
add NETS 1.1.1.1
create V6 hash:ip family inet6 hashsize 1024 maxelem 65536
add V6 fd00::1
"""


@pytest.fixture
def sets() -> IpsetTable:
    return load_save(SAVE)


def k(ip: str, port: int = 0, proto: str = "tcp") -> tuple[str, int, str]:
    return (ip, port, proto)


def test_save_round_trip(sets: IpsetTable) -> None:
    """format_save(load_save(text)) reproduces ipset save text, comments and options included."""
    assert format_save(sets) == SAVE


def test_hash_ip_port_matches_address_protocol_and_port(sets: IpsetTable) -> None:
    """hash:ip,port with dst,dst: ip, protocol and port must all match."""
    assert sets.lookup("KUBE-CLUSTER-IP", (k("10.96.0.1", 443), k("10.96.0.1", 443))) is True
    assert sets.lookup("KUBE-CLUSTER-IP", (k("10.96.0.1", 443, "udp"), k("10.96.0.1", 443, "udp"))) is False


def test_fewer_flags_than_dimensions_never_match(sets: IpsetTable) -> None:
    """ip_set_test returns 0 when the match gives fewer dimensions than the type has."""
    assert sets.lookup("KUBE-CLUSTER-IP", (k("10.96.0.1", 443),)) is False


def test_hash_ip_port_ip_uses_the_third_flag(sets: IpsetTable) -> None:
    """KUBE-LOOP-BACK dst,dst,src: the hairpin case matches only when the source is the endpoint."""
    dst = k("10.244.1.2", 8080)
    assert sets.lookup("KUBE-LOOP-BACK", (dst, dst, k("10.244.1.2", 5555))) is True
    assert sets.lookup("KUBE-LOOP-BACK", (dst, dst, k("10.244.9.9", 5555))) is False


def test_hash_ip_port_net_matches_inside_the_network(sets: IpsetTable) -> None:
    """The net part matches any address inside the stored /16."""
    dst = k("1.2.3.4", 80)
    assert sets.lookup("KUBE-LOAD-BALANCER-SOURCE-CIDR", (dst, dst, k("192.168.44.1"))) is True
    assert sets.lookup("KUBE-LOAD-BALANCER-SOURCE-CIDR", (dst, dst, k("192.169.0.1"))) is False


def test_hash_net_host_entry_prints_without_prefix(sets: IpsetTable) -> None:
    """A /32 stored in hash:net saves as a bare address and matches only itself."""
    assert "add NETS 1.1.1.1\n" in format_save(sets)
    assert sets.lookup("NETS", (k("1.1.1.1"),)) is True
    assert sets.lookup("NETS", (k("1.1.1.2"),)) is False
    assert sets.lookup("NETS", (k("10.200.0.1"),)) is True


def test_bitmap_port_ignores_address_and_protocol(sets: IpsetTable) -> None:
    """bitmap:port keys only the port."""
    assert sets.lookup("KUBE-NODE-PORT-TCP", (k("9.9.9.9", 30080, "udp"),)) is True
    assert sets.lookup("KUBE-NODE-PORT-TCP", (k("9.9.9.9", 30081),)) is False


def test_family_mismatch_does_not_match(sets: IpsetTable) -> None:
    """An IPv4 packet never matches an inet6 set."""
    assert sets.lookup("V6", (k("10.0.0.1"),)) is False
    assert sets.lookup("V6", (k("fd00::1"),)) is True


def test_unknown_set_is_unknown(sets: IpsetTable) -> None:
    """SetLookup returns None for a set that does not exist, so the netfilter match is unknown."""
    assert sets.lookup("NOPE", (k("1.1.1.1"),)) is None


def test_default_port_protocol_is_tcp() -> None:
    """`add S 10.0.0.1,80` stores tcp:80, as ipset does."""
    t = load_save("create S hash:ip,port family inet hashsize 1024 maxelem 65536\nadd S 10.0.0.1,80\n")
    assert format_save(t).endswith("add S 10.0.0.1,tcp:80\n")


def test_ranges_expand() -> None:
    """An IP range in hash:ip and a port range in hash:ip,port expand to single elements."""
    t = load_save("create S hash:ip family inet hashsize 1024 maxelem 65536\nadd S 10.0.0.0/30\n")
    assert t.get("S").elements() == ["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3"]


def test_duplicate_add_fails_unless_exist() -> None:
    """A second add of the same element is an error, unless -exist."""
    text = "create S hash:ip family inet hashsize 1024 maxelem 65536\nadd S 10.0.0.1\nadd S 10.0.0.1\n"
    with pytest.raises(IpsetError, match="line 3"):
        load_save(text)
    assert load_save(text, exist=True).get("S").elements() == ["10.0.0.1"]


def test_errors_name_the_line() -> None:
    """A bad element is reported with its line number and text."""
    with pytest.raises(IpsetError, match=r"line 2: .*not-an-ip"):
        load_save("create S hash:ip family inet hashsize 1024 maxelem 65536\nadd S not-an-ip\n")


def test_maxelem_is_enforced() -> None:
    """Adding beyond maxelem fails, as the kernel's hash types do."""
    with pytest.raises(IpsetError, match="full"):
        load_save("create S hash:ip family inet hashsize 64 maxelem 1\nadd S 10.0.0.1\nadd S 10.0.0.2\n")


def test_unmodelled_type_is_refused() -> None:
    """hash:mac is not modelled: refused loudly, never a silent empty set."""
    with pytest.raises(IpsetError, match="hash:mac"):
        load_save("create S hash:mac\n")
