# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Shared fixtures for the netfilter emulator tests: a node like kube-proxy's test node, and rules."""

from __future__ import annotations

import random

from emulation.clock import ManualClock
from emulation.netfilter import Netns
from emulation.node import Interface, Node, Route
from emulation.packet import Packet

NODE_IP = "192.168.0.2"


def make_node(*, route_localnet: bool = False) -> Node:
    """A node with eth0 192.168.0.2/24 (default route), a pod bridge cni0 10.0.0.1/16 and v6."""
    return Node(
        interfaces=(
            Interface(name="eth0", addresses=("192.168.0.2/24", "2001:db8::1/64")),
            Interface(name="cni0", addresses=("10.0.0.1/16",)),
        ),
        routes=(
            Route(destination="default", device="eth0", via="192.168.0.1"),
            Route(destination="default", device="eth0", via="2001:db8::ff", version=6),
        ),
        route_localnet=route_localnet,
    )


def netns(rules: str = "", *, clock: ManualClock | None = None, **kw: object) -> Netns:
    """A Netns on :func:`make_node` with ``rules`` restored."""
    ns = Netns(make_node(), clock or ManualClock())
    if rules:
        ns.restore(rules, **kw)  # type: ignore[arg-type]
    return ns


def filter_input(spec: str, *, policy: str = "DROP") -> str:
    """A filter table whose INPUT accepts what ``spec`` matches and drops the rest."""
    return f"*filter\n:INPUT {policy} [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT {spec} -j ACCEPT\nCOMMIT\n"


def pkt(
    src: str = "203.0.113.2", dst: str = NODE_IP, sport: int = 40000, dport: int = 80, **kw: object
) -> Packet:
    """A packet arriving on eth0 by default."""
    kw.setdefault("in_interface", "eth0")
    return Packet(src=src, dst=dst, sport=sport, dport=dport, **kw)  # type: ignore[arg-type]


RNG = random.Random(7)

#: A kube-proxy-like nat table: one ClusterIP service with three endpoints, masquerade chain.
KUBE_NAT = """*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-AAA - [0:0]
:KUBE-SEP-1 - [0:0]
:KUBE-SEP-2 - [0:0]
:KUBE-SEP-3 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-AAA
-A KUBE-SVC-AAA -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-AAA -m comment --comment "ns1/svc1:p80 -> 10.0.1.1:8080" -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-1
-A KUBE-SVC-AAA -m comment --comment "ns1/svc1:p80 -> 10.0.1.2:8080" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-2
-A KUBE-SVC-AAA -m comment --comment "ns1/svc1:p80 -> 10.0.1.3:8080" -j KUBE-SEP-3
-A KUBE-SEP-1 -m comment --comment ns1/svc1:p80 -s 10.0.1.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-1 -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.0.1.1:8080
-A KUBE-SEP-2 -m comment --comment ns1/svc1:p80 -s 10.0.1.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-2 -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.0.1.2:8080
-A KUBE-SEP-3 -m comment --comment ns1/svc1:p80 -s 10.0.1.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-3 -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.0.1.3:8080
COMMIT
"""
