# ruff: noqa: E501  (test names, docstrings and tables are kept whole to stay readable)
"""The ipvs mode's renderer against kube-proxy's ``pkg/proxy/ipvs/proxier_test.go`` expectations."""

from __future__ import annotations

from kproxy.model import IPFamily
from kproxy.modes.ipvs import (
    FLAG_PERSISTENT,
    FLAG_SOURCE_HASH,
    IpvsConfig,
    RealServer,
    render,
    render_state,
    set_name,
)
from tests.unit.modes.kube import endpoint_slice, ep, port, service, snapshot_of

NODE_IPS = ("100.101.102.103",)
CFG = IpvsConfig(node_ips=NODE_IPS)


def _servers(state):  # type: ignore[no-untyped-def]
    return {vs.label: vs for vs in state.virtual_servers}


def test_cluster_ip_virtual_server_and_real_servers() -> None:
    """A ClusterIP port becomes one bound rr virtual server with weight-1 real servers (TestClusterIP)."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80)]),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], [("p80", 80, "TCP")])]
    state = render_state(snapshot_of(docs), CFG)
    vs = _servers(state)["TCP 10.20.30.41:80"]
    assert (vs.scheduler, vs.flags, vs.timeout_s, vs.bind) == ("rr", 0, 0, True)
    assert vs.real_servers == (RealServer(address="10.180.0.1", port=80, weight=1),)
    assert state.bound_addresses == ("10.20.30.41",)
    assert state.ipset("KUBE-CLUSTER-IP").entries == ("10.20.30.41,tcp:80",)
    assert state.ipset("KUBE-IPVS-IPS").entries == ("10.20.30.41",)


def test_node_port_one_unbound_virtual_server_per_node_ip() -> None:
    """A NodePort gets an unbound virtual server on every node IP and a bitmap entry (TestNodePortIPv4)."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80, nodePort=3001)], type="NodePort"),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], [("p80", 80, "TCP")])]
    state = render_state(snapshot_of(docs), IpvsConfig(node_ips=("100.101.102.103", "100.101.102.104")))
    servers = _servers(state)
    assert {"TCP 100.101.102.103:3001", "TCP 100.101.102.104:3001"} <= set(servers)
    assert not servers["TCP 100.101.102.103:3001"].bind
    assert state.ipset("KUBE-NODE-PORT-TCP").entries == ("3001",)
    assert state.bound_addresses == ("10.20.30.41",)


def test_sctp_node_port_uses_hash_ip_port_per_node_ip() -> None:
    """An SCTP NodePort is written per node IP into KUBE-NODE-PORT-SCTP-HASH (TestNodePortIPv4 SCTP)."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80, "SCTP", nodePort=3001)], type="NodePort"),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], [("p80", 80, "SCTP")])]
    state = render_state(snapshot_of(docs), CFG)
    assert state.ipset("KUBE-NODE-PORT-SCTP-HASH").entries == ("100.101.102.103,sctp:3001",)


def test_session_affinity_is_persistence_with_the_service_timeout() -> None:
    """ClientIP affinity sets the persistent flag and the Service's timeout on every virtual server."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80, nodePort=3001)], type="NodePort",
                    sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 180}}),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], [("p80", 80, "TCP")])]
    for vs in render_state(snapshot_of(docs), CFG).virtual_servers:
        assert (vs.flags, vs.timeout_s) == (FLAG_PERSISTENT, 180)


def test_mh_scheduler_sets_the_source_hash_flag() -> None:
    """With the mh scheduler every virtual server carries FlagSourceHash (mh-port)."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80)])]
    state = render_state(snapshot_of(docs), IpvsConfig(node_ips=NODE_IPS, scheduler="mh"))
    assert state.virtual_servers[0].flags == FLAG_SOURCE_HASH
    assert "-A -t 10.20.30.41:80 -s mh -b mh-port" in render(snapshot_of(docs), IpvsConfig(scheduler="mh")).ipvsadm


def test_external_traffic_policy_local_uses_local_endpoints_and_local_sets() -> None:
    """eTP=Local gives external virtual servers only local endpoints and fills the -LOCAL sets (TestOnlyLocalNodePorts)."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80, nodePort=3001)], type="LoadBalancer",
                    externalTrafficPolicy="Local", externalIPs=["50.60.70.81"], ingress=["1.2.3.4"]),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1", "test-node"), ep("10.180.1.1", "other")],
                           [("p80", 80, "TCP")])]
    state = render_state(snapshot_of(docs), CFG)
    servers = _servers(state)
    local = (RealServer(address="10.180.0.1", port=80),)
    for label in ("TCP 100.101.102.103:3001", "TCP 50.60.70.81:80", "TCP 1.2.3.4:80"):
        assert servers[label].real_servers == local
    assert len(servers["TCP 10.20.30.41:80"].real_servers) == 2
    assert state.ipset("KUBE-NODE-PORT-LOCAL-TCP").entries == ("3001",)
    assert state.ipset("KUBE-EXTERNAL-IP-LOCAL").entries == ("50.60.70.81,tcp:80",)
    assert state.ipset("KUBE-LOAD-BALANCER-LOCAL").entries == ("1.2.3.4,tcp:80",)
    assert state.ipset("KUBE-LOOP-BACK").entries == ("10.180.0.1,tcp:80,10.180.0.1",)


def test_etp_local_without_local_endpoints_falls_back_to_cluster_endpoints() -> None:
    """With no local endpoint, eTP=Local virtual servers get the cluster endpoints (kubernetes PR 97081)."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80, nodePort=3001)], type="NodePort",
                    externalTrafficPolicy="Local"),
            endpoint_slice("ns1", "svc1", [ep("10.180.1.1", "other")], [("p80", 80, "TCP")])]
    vs = _servers(render_state(snapshot_of(docs), CFG))["TCP 100.101.102.103:3001"]
    assert vs.real_servers == (RealServer(address="10.180.1.1", port=80),)


def test_internal_traffic_policy_local_without_local_endpoints_has_no_real_servers() -> None:
    """iTP=Local with only remote endpoints leaves the ClusterIP virtual server empty (TestInternalTrafficPolicy)."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80)], internalTrafficPolicy="Local"),
            endpoint_slice("ns1", "svc1", [ep("10.180.1.1", "other")], [("p80", 80, "TCP")])]
    assert render_state(snapshot_of(docs), CFG).virtual_servers[0].real_servers == ()


def test_terminating_endpoints_are_the_fallback() -> None:
    """Serving-terminating endpoints are used only when none is ready (TestTestEndpointsTerminating)."""
    term = {"ready": False, "serving": True, "terminating": True}
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80)]),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1", "test-node", **term)], [("p80", 80, "TCP")])]
    assert render_state(snapshot_of(docs), CFG).virtual_servers[0].real_servers == (
        RealServer(address="10.180.0.1", port=80),)


def test_load_balancer_source_ranges_fill_the_firewall_sets() -> None:
    """Source ranges fill -FW and -SOURCE-CIDR, and -SOURCE-IP when a range holds the node IP (TestLoadBalancerSourceRanges)."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80, nodePort=3001)], type="LoadBalancer",
                    loadBalancerSourceRanges=["1.2.3.0/24", "100.101.102.0/24"], ingress=["1.2.3.4"])]
    state = render_state(snapshot_of(docs), CFG)
    assert state.ipset("KUBE-LOAD-BALANCER-FW").entries == ("1.2.3.4,tcp:80",)
    assert state.ipset("KUBE-LOAD-BALANCER-SOURCE-CIDR").entries == (
        "1.2.3.4,tcp:80,1.2.3.0/24", "1.2.3.4,tcp:80,100.101.102.0/24")
    assert state.ipset("KUBE-LOAD-BALANCER-SOURCE-IP").entries == ("1.2.3.4,tcp:80,1.2.3.4",)
    assert state.lb_no_node_access == ()


def test_source_ranges_without_the_node_ip_block_node_access() -> None:
    """Ranges that leave the node IP out add a KUBE-IPVS-OUT-FILTER DROP (kubernetes issue 119656)."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80)], type="LoadBalancer",
                    loadBalancerSourceRanges=["1.2.3.0/24"], ingress=["1.2.3.4"])]
    out = render(snapshot_of(docs), CFG)
    assert ("-A KUBE-IPVS-OUT-FILTER -s 1.2.3.4 -m ipvs --vaddr 1.2.3.4 --vproto tcp --vport 80 -j DROP"
            in out.iptables.splitlines())


def test_static_rules_match_write_iptables_rules() -> None:
    """The rules every sync writes are kube-proxy's (writeIptablesRules, TestMasqueradeRule)."""
    text = render(snapshot_of([]), IpvsConfig(random_fully=False)).iptables.splitlines()
    for line in (
        "-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN",
        "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT",
        "-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE',
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000",
        "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP",
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT",
    ):
        assert line in text
    assert not any("KUBE-CLUSTER-IP" in t and "KUBE-MARK-MASQ" in t for t in text)


def test_cluster_ip_masquerade_rule_follows_the_detector() -> None:
    """KUBE-CLUSTER-IP marks all with --masquerade-all, non-pod sources with a CIDR, else src,dst (TestMasqueradeRule)."""
    docs = [service("ns1", "svc1", "10.20.30.41", [port("p80", 80)])]
    snap = snapshot_of(docs)
    head = ('-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" '
            "-m set --match-set KUBE-CLUSTER-IP")
    cases = {IpvsConfig(masquerade_all=True): f"{head} dst,dst -j KUBE-MARK-MASQ",
             IpvsConfig(cluster_cidr=("10.0.0.0/8",)): f"{head} dst,dst ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ",
             IpvsConfig(): f"{head} src,dst -j KUBE-MARK-MASQ"}
    for cfg, line in cases.items():
        assert line in render(snap, cfg).iptables.splitlines()


def test_ipv6_sets_take_the_kube_6_prefix() -> None:
    """IPv6 set names replace KUBE- by KUBE-6- and are cut to 31 characters (NewIPSet)."""
    assert set_name("KUBE-CLUSTER-IP", True) == "KUBE-6-CLUSTER-IP"
    assert set_name("KUBE-LOAD-BALANCER-SOURCE-CIDR", True) == "KUBE-6-LOAD-BALANCER-SOURCE-CID"
    docs = [service("ns1", "svc1", "fd00::41", [port("p80", 80)], ipFamilies=["IPv6"])]
    out = render(snapshot_of(docs), IpvsConfig(family=IPFamily.IPv6))
    assert "add KUBE-6-CLUSTER-IP fd00::41,tcp:80" in out.ipsets
    assert "-A KUBE-SERVICES -s ::1/128 -j RETURN" in out.iptables
