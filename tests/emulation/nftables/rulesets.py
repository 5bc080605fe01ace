# ruff: noqa: E501  (nft rules and element lists are kept whole, as nft prints them)
"""kube-proxy-shaped nftables rulesets, written by hand from the reference's section 5 (the
newest base chains of kube-proxy's nftables proxier), shared by the unit and kernel tests.

:data:`KUBE_PROXY_BLOCK` is the block form; :data:`KUBE_PROXY_COMMANDS` the same objects as
knftables writes a transaction (every chain added before a rule refers to it, as nft 1.0.6
requires). The node is 10.99.0.1 (``veth`` to the client), pods 10.180.0.1 and 10.180.0.2.
"""

from __future__ import annotations

#: ClusterIP 172.30.0.41:80/tcp with two endpoints; 172.30.0.42:53/udp with one; 172.30.0.43:80
#: without endpoints (REJECT); NodePort 3001 to service 1.
KUBE_PROXY_BLOCK = """\
table ip kube-proxy {
  comment "rules for kube-proxy"
  set cluster-ips { type ipv4_addr; comment "Active ClusterIPs"; elements = { 172.30.0.41, 172.30.0.42, 172.30.0.43 } }
  set nodeport-ips { type ipv4_addr; comment "IPs that accept NodePort traffic"; elements = { 10.99.0.1 } }
  map service-ips {
    type ipv4_addr . inet_proto . inet_service : verdict
    comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
    elements = { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80,
                 172.30.0.42 . udp . 53 : goto service-42NFTM6N-ns2/svc2/udp/dns }
  }
  map service-nodeports {
    type inet_proto . inet_service : verdict
    comment "NodePort traffic"
    elements = { tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
  }
  map no-endpoint-services {
    type ipv4_addr . inet_proto . inet_service : verdict
    comment "vmap to drop or reject packets to services with no endpoints"
    elements = { 172.30.0.43 . tcp . 80 comment "ns3/svc3/tcp/p80" : goto reject-chain }
  }
  map no-endpoint-nodeports {
    type inet_proto . inet_service : verdict
    comment "vmap to drop or reject packets to service nodeports with no endpoints"
  }
  map firewall-ips {
    type ipv4_addr . inet_proto . inet_service : verdict
    comment "destinations that are subject to LoadBalancerSourceRanges"
  }
  chain filter-prerouting-pre-dnat {
    type filter hook prerouting priority dstnat - 10; policy accept;
    ct state new jump firewall-check
  }
  chain filter-output-pre-dnat {
    type filter hook output priority -110; policy accept;
    ct state new jump firewall-check
  }
  chain filter-forward {
    type filter hook forward priority filter; policy accept;
    ct state new jump service-endpoints-check
    ct state new jump cluster-ips-check
  }
  chain filter-input {
    type filter hook input priority filter; policy accept;
    ct state new jump nodeport-endpoints-check
    ct state new jump service-endpoints-check
  }
  chain filter-output {
    type filter hook output priority filter; policy accept;
    ct state new jump service-endpoints-check
    ct state new jump cluster-ips-check
  }
  chain nat-prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    jump services
  }
  chain nat-output {
    type nat hook output priority -100; policy accept;
    jump services
  }
  chain nat-postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    jump masquerading
  }
  chain mark-for-masquerade {
    mark set mark or 0x4000
  }
  chain masquerading {
    mark and 0x4000 == 0 return
    mark set mark xor 0x4000
    masquerade fully-random
  }
  chain cluster-ips-check {
    ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
    ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
  }
  chain reject-chain {
    comment "helper for @no-endpoint-services / @no-endpoint-nodeports"
    reject
  }
  chain service-endpoints-check {
    ip daddr . meta l4proto . th dport vmap @no-endpoint-services
  }
  chain nodeport-endpoints-check {
    ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
  }
  chain firewall-check {
    ip daddr . meta l4proto . th dport vmap @firewall-ips
  }
  chain services {
    ip daddr . meta l4proto . th dport vmap @service-ips
    ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
  }
  chain service-ULMVA6XW-ns1/svc1/tcp/p80 {
    ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
    numgen random mod 2 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80, 1 : goto endpoint-MTX4QZ2N-ns1/svc1/tcp/p80__10.180.0.2/80 }
  }
  chain external-ULMVA6XW-ns1/svc1/tcp/p80 {
    jump mark-for-masquerade
    goto service-ULMVA6XW-ns1/svc1/tcp/p80
  }
  chain endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 {
    ip saddr 10.180.0.1 jump mark-for-masquerade
    meta l4proto tcp counter dnat to 10.180.0.1:80
  }
  chain endpoint-MTX4QZ2N-ns1/svc1/tcp/p80__10.180.0.2/80 {
    ip saddr 10.180.0.2 jump mark-for-masquerade
    meta l4proto tcp counter dnat to 10.180.0.2:80
  }
  chain service-42NFTM6N-ns2/svc2/udp/dns {
    ip daddr 172.30.0.42 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
    numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns2/svc2/udp/dns__10.180.0.2/53 }
  }
  chain endpoint-GTK6MW7G-ns2/svc2/udp/dns__10.180.0.2/53 {
    ip saddr 10.180.0.2 jump mark-for-masquerade
    meta l4proto udp counter dnat to 10.180.0.2:53
  }
}
"""

#: A knftables-style transaction in the command form, its chains before the rules using them.
KUBE_PROXY_COMMANDS = """\
add table ip kube-proxy { comment "rules for kube-proxy" ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy masquerading
add chain ip kube-proxy services
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80
add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }
flush chain ip kube-proxy nat-prerouting
flush chain ip kube-proxy services
flush set ip kube-proxy cluster-ips
flush map ip kube-proxy service-ips
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
"""

#: Expressions beyond kube-proxy's, in a table of the inet family and one of ip6.
MISC = """\
table inet cni {
  set cidrs { type ipv4_addr; flags interval; elements = { 10.0.0.0/8, 192.168.1.1, 192.168.2.0-192.168.2.9 } }
  set ports { type inet_service; flags interval; comment "y"; elements = { 80, 443, 1000-2000 } }
  set affinity { type ipv4_addr; flags dynamic,timeout; timeout 10800s; }
  map marks { type ipv4_addr : mark; elements = { 1.1.1.1 : 0x10 } }
  chain cni-input { type filter hook input priority filter + 10; policy accept;
    meta nfproto ipv4 ip saddr @cidrs tcp dport @ports accept
    iifname "eth0" oifname != "lo" reject with icmp type host-unreachable
    ct state established,related accept
    ct status dnat accept
    fib daddr type local counter
    th dport { 80, 443 } drop
    update @affinity { ip saddr }
    reject with tcp reset
  }
  chain cni-forward { type filter hook forward priority -5; policy drop;
    meta mark 0x4000 accept
    meta mark set 0x1
    udp sport 53 return
    ip protocol udp accept
  }
}
table ip6 v6 {
  chain cni-pre { type filter hook prerouting priority raw; policy accept;
    ip6 daddr fd00::1 tcp dport 80 counter packets 3 bytes 180 drop
    ip6 saddr != { fd00::/64, fd01::1 } notrack
  }
}
"""


def flows_ruleset(
    *,
    pa: str,
    pb: str,
    remote: str,
    port: int,
    nodeport_ip: str,
    family: str = "ip",
    pod_cidr: str = "10.0.0.0/8",
) -> str:
    """A kube-proxy-shaped table for packet flows through the kernel-test topology.

    ``family`` ``ip`` (the addresses below) or ``ip6`` (the same shape in fd00:30::/112,
    ``pod_cidr`` the pods' range). Services: 172.30.0.41:80/tcp to ``pa`` and ``pb`` (NodePort 3001 too), 172.30.0.42:53/udp
    to ``pa``, 172.30.0.43:80/tcp without endpoints (REJECT), 172.30.0.44:80/tcp to ``remote``;
    the rest of 172.30.0.0/16 is dropped. Pod traffic (10.0.0.0/8) is not masqueraded to a
    ClusterIP; external traffic is. Counters sit where every node sees the same packets: the
    first packet of each new flow (nat chains, and the elements of ``service-ips``, which has
    per-element counters), the reject and the drop.
    """
    ip, addr = ("ip", "ipv4_addr") if family == "ip" else ("ip6", "ipv6_addr")
    c1, c2, c3, c4, cidr = (
        ("172.30.0.41", "172.30.0.42", "172.30.0.43", "172.30.0.44", "172.30.0.0/16")
        if family == "ip"
        else ("fd00:30::41", "fd00:30::42", "fd00:30::43", "fd00:30::44", "fd00:30::/112")
    )

    def hostport(host: str) -> str:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    ep_a = f"endpoint-AAAAAAAA-ns1/svc1/tcp/p80__{pa.replace(':', '.')}/{port}"
    ep_b = f"endpoint-BBBBBBBB-ns1/svc1/tcp/p80__{pb.replace(':', '.')}/{port}"
    ep_u = f"endpoint-CCCCCCCC-ns2/svc2/udp/dns__{pa.replace(':', '.')}/{port}"
    ep_r = f"endpoint-DDDDDDDD-ns4/svc4/tcp/p80__{remote.replace(':', '.')}/{port}"
    return f"""\
table {family} kube-proxy {{
  comment "rules for kube-proxy"
  set cluster-ips {{ type {addr}; comment "Active ClusterIPs"; elements = {{ {c1}, {c2}, {c3}, {c4} }} }}
  set nodeport-ips {{ type {addr}; elements = {{ {nodeport_ip} }} }}
  map service-ips {{
    type {addr} . inet_proto . inet_service : verdict
    counter
    elements = {{ {c1} . tcp . 80 : goto service-1-ns1/svc1/tcp/p80,
                 {c2} . udp . 53 : goto service-2-ns2/svc2/udp/dns,
                 {c4} . tcp . 80 : goto service-4-ns4/svc4/tcp/p80 }}
  }}
  map service-nodeports {{ type inet_proto . inet_service : verdict; elements = {{ tcp . 3001 : goto external-1-ns1/svc1/tcp/p80 }} }}
  map no-endpoint-services {{
    type {addr} . inet_proto . inet_service : verdict
    elements = {{ {c3} . tcp . 80 comment "ns3/svc3/tcp/p80" : goto reject-chain }}
  }}
  map no-endpoint-nodeports {{ type inet_proto . inet_service : verdict; }}
  map firewall-ips {{ type {addr} . inet_proto . inet_service : verdict; }}
  chain filter-prerouting-pre-dnat {{
    type filter hook prerouting priority dstnat - 10; policy accept;
    ct state new jump firewall-check
  }}
  chain filter-output-pre-dnat {{
    type filter hook output priority -110; policy accept;
    ct state new jump firewall-check
  }}
  chain filter-forward {{
    type filter hook forward priority filter; policy accept;
    ct state new jump service-endpoints-check
    ct state new jump cluster-ips-check
  }}
  chain filter-input {{
    type filter hook input priority filter; policy accept;
    ct state new jump nodeport-endpoints-check
    ct state new jump service-endpoints-check
  }}
  chain filter-output {{
    type filter hook output priority filter; policy accept;
    ct state new jump service-endpoints-check
    ct state new jump cluster-ips-check
  }}
  chain nat-prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    counter jump services
  }}
  chain nat-output {{
    type nat hook output priority -100; policy accept;
    jump services
  }}
  chain nat-postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    jump masquerading
  }}
  chain mark-for-masquerade {{
    mark set mark or 0x4000
  }}
  chain masquerading {{
    mark and 0x4000 == 0 return
    mark set mark xor 0x4000
    masquerade fully-random
  }}
  chain cluster-ips-check {{
    {ip} daddr @cluster-ips counter reject comment "Reject traffic to invalid ports of ClusterIPs"
    {ip} daddr {{ {cidr} }} counter drop comment "Drop traffic to unallocated ClusterIPs"
  }}
  chain reject-chain {{
    counter reject
  }}
  chain service-endpoints-check {{
    {ip} daddr . meta l4proto . th dport vmap @no-endpoint-services
  }}
  chain nodeport-endpoints-check {{
    {ip} daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
  }}
  chain firewall-check {{
    {ip} daddr . meta l4proto . th dport vmap @firewall-ips
  }}
  chain services {{
    {ip} daddr . meta l4proto . th dport vmap @service-ips
    {ip} daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
  }}
  chain service-1-ns1/svc1/tcp/p80 {{
    {ip} daddr {c1} {ip} saddr != {pod_cidr} jump mark-for-masquerade
    numgen random mod 2 vmap {{ 0 : goto {ep_a}, 1 : goto {ep_b} }}
  }}
  chain external-1-ns1/svc1/tcp/p80 {{
    jump mark-for-masquerade
    goto service-1-ns1/svc1/tcp/p80
  }}
  chain {ep_a} {{
    {ip} saddr {pa} jump mark-for-masquerade
    meta l4proto tcp dnat to {hostport(pa)}
  }}
  chain {ep_b} {{
    {ip} saddr {pb} jump mark-for-masquerade
    meta l4proto tcp dnat to {hostport(pb)}
  }}
  chain service-2-ns2/svc2/udp/dns {{
    {ip} daddr {c2} {ip} saddr != {pod_cidr} jump mark-for-masquerade
    numgen random mod 1 vmap {{ 0 : goto {ep_u} }}
  }}
  chain {ep_u} {{
    {ip} saddr {pa} jump mark-for-masquerade
    meta l4proto udp counter dnat to {hostport(pa)}
  }}
  chain service-4-ns4/svc4/tcp/p80 {{
    {ip} daddr {c4} {ip} saddr != {pod_cidr} jump mark-for-masquerade
    numgen random mod 1 vmap {{ 0 : goto {ep_r} }}
  }}
  chain {ep_r} {{
    {ip} saddr {remote} jump mark-for-masquerade
    meta l4proto tcp counter dnat to {hostport(remote)}
  }}
}}
"""


#: NAT maps, counter sets and a dynamic set that a rule updates (nft then sizes it 65535).
MAPS = """\
table ip t {
  set s { type ipv4_addr; counter; elements = { 1.1.1.1, 1.1.1.2 } }
  set upd { type ipv4_addr; flags dynamic,timeout; timeout 1h; }
  set plain { type ipv4_addr; flags dynamic,timeout; timeout 1h; }
  set lone { type ipv4_addr; flags timeout; timeout 1h; }
  map m { type ipv4_addr . inet_service : ipv4_addr . inet_service; elements = { 172.30.0.1 . 80 : 10.0.0.1 . 8080 } }
  map vm { type ipv4_addr : verdict; counter; elements = { 2.2.2.2 : drop } }
  chain pre { type nat hook prerouting priority dstnat; policy accept;
    ip saddr @s counter accept
    update @upd { ip saddr }
    dnat ip to ip daddr . tcp dport map @m
    ip daddr vmap @vm
    dnat to ip daddr map { 172.30.0.2 : 10.0.0.2 }
  }
}
"""
