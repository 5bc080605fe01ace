"""Unit tests of listen-address allocation and the thin binding step."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from kproxy.errors import ConfigError
from kproxy.model import Protocol
from kproxy.modes.userspace import (
    ListenPlan,
    UserspaceProxy,
    allocate_addresses,
    bind_socket,
    bind_sockets,
    check_bind_address,
    check_loopback_block,
    plan_listen,
    split_host_port,
)

CIPS = [f"10.96.{i // 256}.{i % 256}" for i in range(500)]


def test_allocation_is_stable_and_distinct() -> None:
    """Each ClusterIP gets a distinct address in 127/8, the same for the same input in any order."""
    one = allocate_addresses(CIPS)
    two = allocate_addresses(reversed(CIPS))
    assert one == two
    assert len(set(one.values())) == len(CIPS)
    assert all(ipaddress.ip_address(a) in ipaddress.ip_network("127.0.0.0/8") for a in one.values())


def test_address_does_not_depend_on_other_services_without_collision() -> None:
    """A ClusterIP's address is the same alone as among 499 others (hash-derived)."""
    alone = allocate_addresses(["10.96.1.7"])
    assert allocate_addresses(CIPS)["10.96.1.7"] == alone["10.96.1.7"]


def test_special_addresses_never_handed_out() -> None:
    """The network, 127.0.0.1 and broadcast addresses are skipped even when the block is nearly full."""
    got = allocate_addresses(["10.0.0.1", "10.0.0.2", "10.0.0.3"], block="127.0.0.0/29")
    assert set(got.values()) <= {f"127.0.0.{i}" for i in range(2, 7)}
    assert len(set(got.values())) == 3


def test_full_block_leaves_the_rest_out() -> None:
    """A block with room for two Services places two and leaves the last in sorted order out."""
    got = allocate_addresses(["10.0.0.3", "10.0.0.1", "10.0.0.2"], block="127.5.0.0/30")
    assert set(got) == {"10.0.0.1", "10.0.0.2"}
    assert set(got.values()) == {"127.5.0.1", "127.5.0.2"}


def test_previous_allocation_is_kept() -> None:
    """Addresses from a previous allocation stay put for ClusterIPs that remain."""
    previous = {"10.0.0.1": "127.9.9.9", "10.0.0.5": "127.1.1.1"}
    got = allocate_addresses(["10.0.0.1", "10.0.0.2"], previous=previous)
    assert got["10.0.0.1"] == "127.9.9.9" and "10.0.0.5" not in got


def test_ipv6_cluster_ips_are_ignored() -> None:
    """IPv6 ClusterIPs get no loopback IPv4 address (they listen on ::1)."""
    assert allocate_addresses(["fd00::1"]) == {}


@pytest.mark.parametrize("block", ["not-a-cidr", "fd00::/64"])
def test_bad_block_raises_config_error(block: str) -> None:
    """A block that is not an IPv4 CIDR is refused with a ConfigError naming it."""
    with pytest.raises(ConfigError, match="loopback_block"):
        allocate_addresses(["10.0.0.1"], block=block)


def test_plan_listen_cases() -> None:
    """bind_address and IPv6 get port 0; IPv4 gets its own address and port; a missing one raises."""
    loop = {"10.0.0.1": "127.3.3.3"}
    assert plan_listen(cluster_ip="10.0.0.1", port=80, bind_address=None, loopback=loop) == \
        ListenPlan(ip="127.3.3.3", port=80, fallback=True)
    assert plan_listen(cluster_ip="10.0.0.1", port=80, bind_address="127.0.0.1", loopback=loop) == \
        ListenPlan(ip="127.0.0.1", port=0, fallback=False)
    assert plan_listen(cluster_ip="fd00::1", port=80, bind_address=None, loopback=loop).ip == "::1"
    with pytest.raises(ConfigError, match=r"10\.0\.0\.2"):
        plan_listen(cluster_ip="10.0.0.2", port=80, bind_address=None, loopback=loop)


def test_bind_falls_back_to_free_port_when_in_use() -> None:
    """bind_socket binds a free port on the same address when the wanted one is in use."""
    with socket.socket() as squatter:
        squatter.bind(("127.41.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        sock = bind_socket(ListenPlan(ip="127.41.0.1", port=taken), Protocol.TCP)
        with sock:
            ip, port = sock.getsockname()
    assert ip == "127.41.0.1" and port != taken


def test_bind_without_fallback_raises() -> None:
    """Without fallback a port in use raises OSError."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind(("127.41.0.2", 0))
        taken = squatter.getsockname()[1]
        with pytest.raises(OSError):
            bind_socket(ListenPlan(ip="127.41.0.2", port=taken, fallback=False), Protocol.UDP)


def test_bind_refuses_sctp() -> None:
    """SCTP is not served in userspace mode."""
    with pytest.raises(ConfigError, match="SCTP"):
        bind_socket(ListenPlan(ip="127.41.0.3", port=0), Protocol.SCTP)


def test_split_host_port() -> None:
    """split_host_port handles IPv4 and bracketed IPv6."""
    assert split_host_port("10.0.0.1:80") == ("10.0.0.1", 80)
    assert split_host_port("[fd00::1]:53") == ("fd00::1", 53)
    with pytest.raises(ValueError):
        split_host_port("10.0.0.1")


def test_bind_sockets_share_a_free_port() -> None:
    """Port 0 gives TCP and UDP one free port number between them."""
    socks = bind_sockets(ListenPlan(ip="127.41.0.4", port=0), [Protocol.UDP, Protocol.TCP])
    try:
        ports = {p: s.getsockname()[1] for p, s in socks.items()}
    finally:
        for sock in socks.values():
            sock.close()
    assert ports[Protocol.TCP] == ports[Protocol.UDP] != 0


def test_bind_sockets_fall_back_together_when_one_protocol_is_taken() -> None:
    """When the wanted port is taken for UDP only, TCP and UDP both move to one free port."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind(("127.41.0.5", 0))
        taken = squatter.getsockname()[1]
        socks = bind_sockets(ListenPlan(ip="127.41.0.5", port=taken), [Protocol.TCP, Protocol.UDP])
        try:
            ports = {s.getsockname()[1] for s in socks.values()}
        finally:
            for sock in socks.values():
                sock.close()
    assert len(ports) == 1 and taken not in ports


def test_check_bind_address_accepts_a_local_address() -> None:
    """An address of this host passes the start-up check."""
    check_bind_address("127.0.0.1")


@pytest.mark.parametrize("address", ["192.0.2.123", "0.0.0.0", "::", "not-an-ip"])
def test_check_bind_address_refuses(address: str) -> None:
    """A bind address that is not local, is a wildcard or is no IP raises ConfigError naming the flag."""
    with pytest.raises(ConfigError, match="--bind-address"):
        check_bind_address(address)


def test_check_loopback_block_accepts_loopback() -> None:
    """127.0.0.0/8 passes the start-up check."""
    check_loopback_block("127.0.0.0/8")


@pytest.mark.parametrize("block", ["198.51.100.0/28", "127.0.0.1/32", "not-a-cidr"])
def test_check_loopback_block_refuses(block: str) -> None:
    """A block this host cannot bind in, one that hands out no address, or no CIDR raises ConfigError."""
    with pytest.raises(ConfigError, match="loopback"):
        check_loopback_block(block)


@pytest.mark.parametrize("address", ["0.0.0.0", "::"])
def test_proxy_refuses_a_wildcard_bind_address(address: str) -> None:
    """UserspaceProxy refuses a wildcard bind address, which would answer UDP from the wrong source."""
    with pytest.raises(ConfigError, match="wildcard cannot answer UDP"):
        UserspaceProxy(bind_address=address)
