"""The node-dump readers on `ip -j` output captured from a flannel-like network namespace.

tests/emulation/data/nodedump/flannel/ was captured (``ip -n NS -j addr show``, ``-j route show
table all``, ``-6 -j route show table all``, ``-j link show``, ``sysctl``) from a namespace with
``eth0`` 192.168.50.2/24 (a veth, default route via 192.168.50.1 onlink), a ``cni0`` bridge
10.244.0.1/24 with the port ``veth1``, and ``flannel.1`` 10.244.0.0/32 with
``10.244.1.0/24 via 10.244.1.0 onlink``; ``xt_recent/FT`` from ``/proc/net/xt_recent/FT``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from emulation.addr import parse_address
from emulation.errors import InputError
from emulation.node import Interface, Node
from emulation.nodedump import (
    node_from_dump,
    parse_ip_addr,
    parse_ip_link,
    parse_ip_route,
    parse_sysctl,
    parse_xt_recent,
)

DATA = Path(__file__).parent / "data" / "nodedump" / "flannel"


def _text(name: str) -> str:
    return (DATA / name).read_text()


def _node() -> Node:
    return node_from_dump(ip_addr=_text("ip-addr.json"), ip_route=_text("ip-route.json"),
                          ip6_route=_text("ip6-route.json"), ip_link=_text("ip-link.json"),
                          sysctl=_text("sysctl.txt"))


def test_interfaces_keep_their_addresses_scopes_and_bridge_masters() -> None:
    node = _node()
    lo, cni0, veth1 = node.interface("lo"), node.interface("cni0"), node.interface("veth1")
    assert lo is not None and cni0 is not None and veth1 is not None
    assert lo.addresses[0] == "127.0.0.1/8" and lo.scope(0) == "host"
    assert cni0.addresses[0] == "10.244.0.1/24" and cni0.scope(0) == "global" and cni0.bridge
    assert veth1.master == "cni0" and not veth1.bridge
    eth0 = node.interface("eth0")
    assert eth0 is not None and "fd00:50::2/64" in eth0.addresses
    assert any(eth0.scope(i) == "link" for i, a in enumerate(eth0.addresses) if a.startswith("fe80"))


def test_routes_take_the_real_devices_and_gateways() -> None:
    node = _node()
    r = node.route(*parse_address("10.244.1.7"))
    assert (r.kind, r.device, r.nexthop) == ("unicast", "flannel.1", "10.244.1.0")
    r = node.route(*parse_address("10.244.0.5"))
    assert (r.kind, r.device) == ("unicast", "cni0")
    r = node.route(*parse_address("8.8.8.8"))
    assert (r.device, r.nexthop) == ("eth0", "192.168.50.1")
    assert node.route(*parse_address("10.244.0.0")).kind == "local"
    assert node.route(*parse_address("fd00:50::9")).device == "eth0"
    assert node.route(*parse_address("2001:db8::1")).kind == "unreachable"  # no IPv6 default route


def test_masquerade_takes_the_out_interfaces_address() -> None:
    node = _node()
    v, dst = parse_address("10.244.1.7")
    assert node.source_address("flannel.1", v, "10.244.1.0", dst) == "10.244.0.0"
    v, dst = parse_address("10.244.0.5")
    assert node.source_address("cni0", v, None, dst) == "10.244.0.1"
    v, dst = parse_address("8.8.8.8")
    assert node.source_address("eth0", v, "192.168.50.1", dst) == "192.168.50.2"


def test_masquerade_never_picks_a_host_scope_address_a_node_talking_to_itself_keeps_its_own() -> None:
    node = _node()
    v, dst = parse_address("192.168.50.2")
    # To itself the packet goes out lo, whose only IPv4 address is host-scope: the walk over the
    # other devices gives the first global address (inet_select_addr's no_in_dev).
    assert node.source_address("lo", v, None, dst) == "192.168.50.2"
    host_only = Node(interfaces=(Interface(name="lo", addresses=("127.0.0.1/8",)),
                                 Interface(name="eth0", addresses=("10.0.0.1/24",), scopes=("host",))))
    assert host_only.source_address("eth0", 4, None, parse_address("10.0.0.9")[1]) is None


def test_sysctls_shape_the_node() -> None:
    node = _node()
    assert not node.ip_forward and not node.route_localnet
    assert parse_sysctl("# c\nnet.ipv4.ip_forward = 1\nnet/ipv4/conf/all/rp_filter=2\n") == {
        "net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "2"}
    with pytest.raises(InputError, match="line 1"):
        parse_sysctl("net.ipv4.ip_forward 1")


def test_local_table_routes_beyond_interface_addresses_are_local() -> None:
    routes = '[{"type":"local","dst":"10.96.0.0/12","dev":"lo","table":"local","scope":"host"}]'
    node = node_from_dump(ip_addr=_text("ip-addr.json"), ip_route=routes)
    assert node.local_prefixes == ("10.96.0.0/12",)
    assert node.route(*parse_address("10.100.0.1")).kind == "local"


def test_down_links_and_other_tables_are_not_routed_through() -> None:
    addr = ('[{"ifname":"lo","flags":["LOOPBACK","UP"],"addr_info":[]},'
            '{"ifname":"eth1","flags":["BROADCAST"],"addr_info":[{"family":"inet","local":"10.1.0.1",'
            '"prefixlen":24,"scope":"global"}]}]')
    routes = ('[{"dst":"10.2.0.0/16","gateway":"10.1.0.254","dev":"eth1"},'
              '{"dst":"10.3.0.0/16","dev":"eth1","table":"100"}]')
    node = node_from_dump(ip_addr=addr, ip_route=routes)
    assert node.route(*parse_address("10.2.0.1")).kind == "unreachable"
    assert node.route(*parse_address("10.3.0.1")).kind == "unreachable"


def test_parsers_refuse_what_ip_does_not_print() -> None:
    with pytest.raises(InputError, match=r"ip-addr\.json: not JSON"):
        parse_ip_addr("addr show")
    with pytest.raises(InputError, match="JSON list"):
        parse_ip_link('{"ifname": "lo"}')
    with pytest.raises(InputError, match="bad address"):
        parse_ip_addr('[{"ifname":"x","addr_info":[{"family":"inet","local":"300.1.1.1","prefixlen":8}]}]')
    with pytest.raises(InputError, match="route"):
        parse_ip_route('[{"dst":"10.0.0.0/8","gateway":"fd00::1","dev":"eth0"}]', 4)


def test_xt_recent_lines_give_addresses_and_stamps_oldest_first() -> None:
    (line,) = parse_xt_recent(_text("xt_recent/FT"))
    assert (line.version, line.value, line.ttl, line.stamps) == (4, parse_address("192.168.50.2")[1], 64,
                                                                 (4298227566,))
    ring = "src=10.0.0.9 ttl: 63 last_seen: 300 oldest_pkt: 2 200, 300, 100\n"
    assert parse_xt_recent(ring)[0].stamps == (100, 200, 300)
    with pytest.raises(InputError, match="line 1"):
        parse_xt_recent("garbage")


def test_a_node_without_dump_files_is_the_default_model() -> None:
    base = Node(interfaces=(Interface(name="eth0", addresses=("10.0.0.1/32",)),))
    node = node_from_dump(defaults=base)
    assert [i.name for i in node.interfaces] == ["lo", "eth0"] and node.ip_forward
