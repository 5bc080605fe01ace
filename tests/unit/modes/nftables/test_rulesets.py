# ruff: noqa: E501  (nft rule text is kept whole on one line, to be read as nft prints it)
"""The rendered transaction against kube-proxy's expected nftables rulesets (``proxier_test.go``)."""

from __future__ import annotations

from typing import Any

from kproxy.model.names import IPFamily, Protocol, ServicePortName
from kproxy.modes.nftables import NftablesConfig, NftablesRenderer, render_transaction, sort_transaction
from kproxy.modes.nftables.names import endpoint_chain_name, service_chain_base
from tests.unit.modes.kube import TEST_NODE, endpoint_slice, ep, port, service, snapshot_of
from tests.unit.modes.nftables.dump import Dump
from tests.unit.modes.nftables.expected import BASE_RULES, OVERALL

FAKE = NftablesConfig.kube_proxy_test_fake()


def overall_cluster() -> list[dict[str, Any]]:
    """The six Services and their slices of kube-proxy's TestOverallNFTablesRules."""
    p80 = [("p80", 80, "TCP")]
    return [
        service("ns1", "svc1", "172.30.0.41", [port("p80", 80)]),
        service("ns2", "svc2", "172.30.0.42", [port("p80", 80, nodePort=3001)], type="LoadBalancer",
                externalTrafficPolicy="Local", externalIPs=["192.168.99.22"], healthCheckNodePort=30000,
                ingress=["1.2.3.4"]),
        service("ns3", "svc3", "172.30.0.43", [port("p80", 80, nodePort=3003)], type="NodePort"),
        service("ns4", "svc4", "172.30.0.44", [port("p80", 80, targetPort=80)], type="NodePort",
                externalIPs=["192.168.99.33"]),
        service("ns5", "svc5", "172.30.0.45", [port("p80", 80, nodePort=3002)], type="LoadBalancer",
                externalTrafficPolicy="Cluster", healthCheckNodePort=30000, ingress=["5.6.7.8"],
                loadBalancerSourceRanges=[" 203.0.113.0/25"], sessionAffinity="ClientIP",
                sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10800}}),
        service("ns6", "svc6", "172.30.0.46", [port("p80", 80, targetPort=80)]),
        endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], p80),
        endpoint_slice("ns2", "svc2", [ep("10.180.0.2")], p80),
        endpoint_slice("ns3", "svc3", [ep("10.180.0.3")], p80),
        endpoint_slice("ns4", "svc4", [ep("10.180.0.4"), ep("10.180.0.5", TEST_NODE)], p80),
        endpoint_slice("ns5", "svc5", [ep("10.180.0.3")], p80),
    ]


def dump_of(*transactions: str) -> str:
    """The state the transactions leave, as knftables' fake prints it."""
    state = Dump()
    for text in transactions:
        state.apply(text)
    return state.text()


def test_overall_ruleset_equals_kube_proxys() -> None:
    """TestOverallNFTablesRules: the six-Service cluster renders kube-proxy's ruleset, line for line."""
    text = render_transaction(snapshot_of(overall_cluster()), FAKE)
    assert sort_transaction(dump_of(text)) == sort_transaction(BASE_RULES + OVERALL)


def test_empty_cluster_renders_the_base_rules() -> None:
    """With no Services the table holds exactly kube-proxy's base rules."""
    text = render_transaction(snapshot_of([]), FAKE)
    assert sort_transaction(dump_of(text)) == sort_transaction(BASE_RULES)


def test_chain_names_hash_as_kube_proxy() -> None:
    """Test_servicePortChainNameBase and Test_servicePortEndpointChainNameBase cases."""
    spn = ServicePortName(namespace="testing", name="service", port="http", protocol=Protocol.TCP)
    assert service_chain_base(spn) == "P4ZYZVCF-testing/service/tcp/http"
    assert endpoint_chain_name(spn, "10.180.0.1", 80) == "endpoint-JO2XBXZR-testing/service/tcp/http__10.180.0.1/80"
    assert endpoint_chain_name(spn, "fd80:abcd:12::a1b2:c3d4:e5f6:9999", 80) == (
        "endpoint-U7E2ET36-testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80")
    long = ServicePortName(namespace="very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx",
                           name="very-long-service-name-why-would-you-even-do-this-i-mean-really",
                           port="port-443-providing-the-hypertext-transmission-protocol-with-tls",
                           protocol=Protocol.SCTP)
    assert service_chain_base(long).startswith("KR6NACJP-very-long-namespace")
    cut = endpoint_chain_name(long, "1234:5678:9abc:def0::abcd:1234:5678", 443)
    assert cut.startswith("endpoint-CI6C53Q3-") and cut.endswith("__1234.5678.9abc.def0..abcd.1234...")
    assert len(cut) == len("endpoint-") + 240


def test_ipv6_uses_the_ip6_table_and_addresses() -> None:
    """The IPv6 proxier writes ``ip6`` matches, ``ipv6_addr`` sets and bracketed DNAT targets."""
    docs = [service("ns1", "svc1", "fd00:172:30::41", [port("p80", 80, nodePort=3001)], type="NodePort",
                    ipFamilies=["IPv6"]),
            endpoint_slice("ns1", "svc1", [ep("fd00:10:180::1")], [("p80", 80, "TCP")], family="IPv6")]
    text = render_transaction(snapshot_of(docs), FAKE.for_family(IPFamily.IPv6))
    assert "add table ip6 kube-proxy" in text
    assert "add element ip6 kube-proxy nodeport-ips { 2001:db8::1 }" in text
    assert "add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:10:96::/112 } drop" in text
    assert "meta l4proto tcp dnat to [fd00:10:180::1]:80" in text
    assert "ip6 saddr != fd00:10::/64 jump mark-for-masquerade" in text
    assert " ip daddr" not in text


def test_no_service_cidr_means_no_drop_rule() -> None:
    """Without --service-cidr the unallocated-ClusterIP DROP rule is left out (REJECT stays)."""
    text = render_transaction(snapshot_of([]), NftablesConfig(node_ips=("192.168.0.2",)))
    assert "Drop traffic to unallocated ClusterIPs" not in text
    assert "Reject traffic to invalid ports of ClusterIPs" in text


def test_nodeport_addresses_all_uses_fib_without_localhost() -> None:
    """--nodeport-addresses 0.0.0.0/0: no nodeport-ips set, fib local minus 127.0.0.0/8."""
    config = NftablesConfig(node_ips=("192.168.0.2",), nodeport_addresses=("0.0.0.0/0",))
    state = dump_of(render_transaction(snapshot_of([]), config))
    assert "nodeport-ips" not in state
    assert ("add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport"
            " vmap @service-nodeports") in state
    assert ("add rule ip kube-proxy nodeport-endpoints-check ip daddr != 127.0.0.0/8 meta l4proto . th dport"
            " vmap @no-endpoint-nodeports") in state


def test_loopback_never_accepts_nodeports() -> None:
    """A --nodeport-addresses range holding 127.0.0.1 still leaves loopback out of nodeport-ips."""
    config = NftablesConfig(node_ips=("127.0.0.1", "192.168.0.2"), nodeport_addresses=("127.0.0.0/8", "192.168.0.0/24"))
    text = render_transaction(snapshot_of([]), config)
    assert "add element ip kube-proxy nodeport-ips { 192.168.0.2 }" in text
    assert "127.0.0.1 }" not in text


def test_source_ranges_holding_the_node_allow_the_vip() -> None:
    """TestLoadBalancer: ranges containing the node IP also allow the LB IPs as sources."""
    docs = [service("ns1", "svc1", "172.30.0.41", [port("p80", 80, nodePort=3001)], type="LoadBalancer",
                    ingress=["1.2.3.4", "5.6.7.8"], loadBalancerSourceRanges=["192.168.0.0/24", " 203.0.113.0/25"]),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], [("p80", 80, "TCP")])]
    text = render_transaction(snapshot_of(docs), FAKE)
    assert "ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 , 1.2.3.4 , 5.6.7.8 } drop" in text


def test_masquerade_all_marks_every_clusterip_packet() -> None:
    """--masquerade-all: the ClusterIP rule marks without the pod-CIDR condition."""
    docs = [service("ns1", "svc1", "172.30.0.41", [port("p80", 80)]),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], [("p80", 80, "TCP")])]
    config = NftablesConfig(node_ips=("192.168.0.2",), cluster_cidr=("10.0.0.0/8",), masquerade_all=True)
    text = render_transaction(snapshot_of(docs), config)
    assert "service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 jump mark-for-masquerade" in text


def test_partial_render_needs_a_committed_full_one() -> None:
    """A partial render before any commit is refused."""
    import pytest

    from kproxy.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        NftablesRenderer(FAKE).render(snapshot_of([]), full=False)


def test_from_run_reads_flag_values() -> None:
    """Flag text (comma-separated) builds the configuration; an empty --nodeport-addresses is primary."""
    config = NftablesConfig.from_run(node_ips=["192.168.0.2"], cluster_cidr="10.0.0.0/8",
                                     service_cidr="172.30.0.0/16, fd00:10:96::/112")
    assert config.nodeport_addresses == ("primary",)
    assert config.service_cidrs == ("172.30.0.0/16", "fd00:10:96::/112")
    assert config.mark == "0x00004000"


def test_bad_flag_values_name_the_flag() -> None:
    """A malformed --service-cidr or --nodeport-addresses is a ConfigError naming the flag."""
    import pytest

    from kproxy.errors import ConfigError

    with pytest.raises(ConfigError, match="--service-cidr"):
        NftablesConfig.from_run(service_cidr="172.30.0.0/99")
    with pytest.raises(ConfigError, match="--nodeport-addresses"):
        NftablesConfig.from_run(nodeport_addresses="nonsense")
    with pytest.raises(ConfigError, match="'primary' must be the only value"):
        NftablesConfig.from_run(nodeport_addresses="primary,10.0.0.0/8")
