"""Per-feature rule tests, after kube-proxy's proxier_test.go cases (each chain in exact order)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kproxy.model import IPFamily
from kproxy.modes.iptables import IptablesConfig, render_full, render_partial
from tests.unit.modes.iptables.restore import apply_noflush
from tests.unit.modes.kube import TEST_NODE, endpoint_slice, ep, next_snapshot, port, service, snapshot_of

FAKE = IptablesConfig.kube_proxy_test_fake()
TCP80 = [("p80", 80, "TCP")]
SVC1 = "XPGD46QRK7WJZT7O"  # ns1/svc1:p80 tcp


def chains(docs: list[dict[str, Any]], config: IptablesConfig = FAKE) -> dict[str, dict[str, list[str]]]:
    """The tables a full render of ``docs`` leaves in an empty kernel."""
    return apply_noflush({}, render_full(snapshot_of(docs), config))


def lb_service(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"type": "LoadBalancer", "externalIPs": ["192.168.99.11"], "ingress": ["1.2.3.4"]}
    return service("ns1", "svc1", "172.30.0.41", [port("p80", 80, nodePort=3001)], **{**base, **spec})


def test_no_endpoints_reject_every_address() -> None:
    """TestNoEndpointsReject: ClusterIP, external IP, LB IP and NodePort all REJECT; no nat chains."""
    t = chains([lb_service()])
    comment = '-m comment --comment "ns1/svc1:p80 has no endpoints" -m tcp -p tcp'
    assert t["filter"]["KUBE-SERVICES"] == [f"-A KUBE-SERVICES {comment} -d 172.30.0.41 --dport 80 -j REJECT"]
    assert t["filter"]["KUBE-EXTERNAL-SERVICES"] == [
        f"-A KUBE-EXTERNAL-SERVICES {comment} -d 192.168.99.11 --dport 80 -j REJECT",
        f"-A KUBE-EXTERNAL-SERVICES {comment} -d 1.2.3.4 --dport 80 -j REJECT",
        '-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns1/svc1:p80 has no endpoints" -m addrtype'
        " --dst-type LOCAL -m tcp -p tcp --dport 3001 -j REJECT",
    ]
    assert not any(c.startswith(("KUBE-SVC", "KUBE-EXT", "KUBE-SEP")) for c in t["nat"])
    assert t["nat"]["KUBE-NODEPORTS"] == []


def test_external_traffic_policy_local() -> None:
    """TestExternalTrafficPolicyLocal: EXT short-circuits pods and the node, else goes to SVL."""
    t = chains([lb_service(externalTrafficPolicy="Local", healthCheckNodePort=30000),
                endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.2.1", TEST_NODE)], TCP80)])
    ext = f"KUBE-EXT-{SVC1}"
    assert t["nat"][ext] == [
        f'-A {ext} -m comment --comment "pod traffic for ns1/svc1:p80 external destinations" -s 10.0.0.0/8'
        f" -j KUBE-SVC-{SVC1}",
        f'-A {ext} -m comment --comment "masquerade LOCAL traffic for ns1/svc1:p80 external destinations"'
        " -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
        f'-A {ext} -m comment --comment "route LOCAL traffic for ns1/svc1:p80 external destinations"'
        f" -m addrtype --src-type LOCAL -j KUBE-SVC-{SVC1}",
        f"-A {ext} -j KUBE-SVL-{SVC1}",
    ]
    assert t["nat"][f"KUBE-SVL-{SVC1}"] == [
        f'-A KUBE-SVL-{SVC1} -m comment --comment "ns1/svc1:p80 -> 10.180.2.1:80"'
        " -j KUBE-SEP-ZX7GRIZKSNUQ3LAJ"]
    assert len(t["nat"][f"KUBE-SVC-{SVC1}"]) == 3  # masquerade rule and two endpoints
    assert t["filter"]["KUBE-EXTERNAL-SERVICES"] == []
    assert t["filter"]["KUBE-NODEPORTS"] == [
        '-A KUBE-NODEPORTS -m comment --comment "ns1/svc1:p80 health check node port" -m tcp -p tcp'
        " --dport 30000 -j ACCEPT"]


def test_external_traffic_policy_cluster_masquerades() -> None:
    """TestExternalTrafficPolicyCluster: the EXT chain masquerades, then goes to SVC."""
    t = chains([lb_service(), endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], TCP80)])
    ext = f"KUBE-EXT-{SVC1}"
    assert t["nat"][ext] == [
        f'-A {ext} -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations"'
        " -j KUBE-MARK-MASQ",
        f"-A {ext} -j KUBE-SVC-{SVC1}",
    ]


def test_internal_traffic_policy_local() -> None:
    """ClusterIP traffic with internalTrafficPolicy Local goes to SVL, masqueraded there."""
    svc = service("ns1", "svc1", "172.30.0.41", [port("p80", 80)], internalTrafficPolicy="Local")
    t = chains([svc, endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.2.1", TEST_NODE)], TCP80)])
    assert t["nat"]["KUBE-SERVICES"][0].endswith(f"-d 172.30.0.41 --dport 80 -j KUBE-SVL-{SVC1}")
    assert f"KUBE-SVC-{SVC1}" not in t["nat"]
    assert t["nat"][f"KUBE-SVL-{SVC1}"][0] == (
        f'-A KUBE-SVL-{SVC1} -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41'
        " --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ")
    assert sorted(c for c in t["nat"] if c.startswith("KUBE-SEP-")) == ["KUBE-SEP-ZX7GRIZKSNUQ3LAJ"]


def test_internal_traffic_policy_local_without_local_endpoints_drops() -> None:
    """No local endpoint with internalTrafficPolicy Local: DROP, not REJECT, and no nat chains."""
    svc = service("ns1", "svc1", "172.30.0.41", [port("p80", 80)], internalTrafficPolicy="Local")
    t = chains([svc, endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], TCP80)])
    assert t["filter"]["KUBE-SERVICES"] == [
        '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 has no local endpoints" -m tcp -p tcp'
        " -d 172.30.0.41 --dport 80 -j DROP"]
    assert [c for c in t["nat"] if c.startswith("KUBE-S")] == ["KUBE-SERVICES"]


def test_external_policy_local_with_only_remote_terminating_endpoints_drops() -> None:
    """A serving-terminating remote endpoint still takes ClusterIP traffic; external traffic gets DROP."""
    t = chains([lb_service(externalTrafficPolicy="Local", healthCheckNodePort=30000),
                endpoint_slice("ns1", "svc1", [ep("10.180.0.1", "other", ready=False, serving=True,
                                                  terminating=True)], TCP80)])
    assert t["nat"][f"KUBE-SVC-{SVC1}"][-1].endswith("-j KUBE-SEP-SXIVWICOYRO3J4NJ")
    targets = {r.rsplit(" ", 1)[1] for r in t["filter"]["KUBE-EXTERNAL-SERVICES"]}
    assert targets == {"DROP"} and len(t["filter"]["KUBE-EXTERNAL-SERVICES"]) == 3
    assert t["nat"][f"KUBE-EXT-{SVC1}"][-1].endswith(f"--src-type LOCAL -j KUBE-SVC-{SVC1}")


def test_not_ready_and_not_serving_endpoints_are_unused() -> None:
    """Endpoints neither ready nor serving get no chain; a Service with only those REJECTs."""
    t = chains([service("ns1", "svc1", "172.30.0.41", [port("p80", 80)]),
                endpoint_slice("ns1", "svc1", [ep("10.180.0.1", ready=False, serving=False)], TCP80)])
    assert t["filter"]["KUBE-SERVICES"][0].endswith("-j REJECT")


def test_session_affinity_checks_every_endpoint_first() -> None:
    """ClientIP affinity: one recent --rcheck per endpoint, then the probability rules."""
    svc = service("ns1", "svc1", "172.30.0.41", [port("p80", 80)], sessionAffinity="ClientIP",
                  sessionAffinityConfig={"clientIP": {"timeoutSeconds": 300}})
    t = chains([svc, endpoint_slice("ns1", "svc1", [ep("10.180.0.1"), ep("10.180.0.2"), ep("10.180.0.3")],
                                    TCP80)])
    rules = t["nat"][f"KUBE-SVC-{SVC1}"][1:]
    assert [r.split("-j ")[0].split('" ', 1)[1] for r in rules] == [
        "-m recent --name KUBE-SEP-SXIVWICOYRO3J4NJ --rcheck --seconds 300 --reap ",
        "-m recent --name KUBE-SEP-LXVODXWDISEETFEF --rcheck --seconds 300 --reap ",
        "-m recent --name KUBE-SEP-ICDUIKC33SFI6ZPR --rcheck --seconds 300 --reap ",
        "-m statistic --mode random --probability 0.3333333333 ",
        "-m statistic --mode random --probability 0.5000000000 ",
        "",
    ]
    assert rules[-1] == (f'-A KUBE-SVC-{SVC1} -m comment --comment "ns1/svc1:p80 -> 10.180.0.3:80"'
                         " -j KUBE-SEP-ICDUIKC33SFI6ZPR")
    sep = t["nat"]["KUBE-SEP-SXIVWICOYRO3J4NJ"]
    assert "-m recent --name KUBE-SEP-SXIVWICOYRO3J4NJ --set -m tcp" in sep[1]


def test_masquerade_all_and_no_local_detection() -> None:
    """--masquerade-all drops the source condition; without a cluster CIDR there is no rule at all."""
    docs = [service("ns1", "svc1", "172.30.0.41", [port("p80", 80)]),
            endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], TCP80)]
    masq_all = chains(docs, replace(FAKE, masquerade_all=True))["nat"][f"KUBE-SVC-{SVC1}"][0]
    assert masq_all.endswith("-d 172.30.0.41 --dport 80 -j KUBE-MARK-MASQ")
    no_cidr = chains(docs, replace(FAKE, cluster_cidr=()))["nat"][f"KUBE-SVC-{SVC1}"]
    assert no_cidr == [f'-A KUBE-SVC-{SVC1} -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80"'
                       " -j KUBE-SEP-SXIVWICOYRO3J4NJ"]


def test_no_local_detection_drops_pod_short_circuit() -> None:
    """Without local detection the Local-policy EXT chain has no pod-traffic rule."""
    t = chains([lb_service(externalTrafficPolicy="Local", healthCheckNodePort=30000),
                endpoint_slice("ns1", "svc1", [ep("10.180.0.1", TEST_NODE)], TCP80)],
               replace(FAKE, cluster_cidr=()))
    words = [r.split('"')[1].split(" ")[0] for r in t["nat"][f"KUBE-EXT-{SVC1}"][:2]]
    assert words == ["masquerade", "route"]


def test_load_balancer_source_ranges() -> None:
    """TestLoadBalancer: KUBE-FW allows the ranges (and the LB IPs, the node being inside one)."""
    t = chains([lb_service(externalIPs=[], ingress=["1.2.3.4", "5.6.7.8"],
                           loadBalancerSourceRanges=["192.168.0.0/24", " 203.0.113.0/25"]),
                endpoint_slice("ns1", "svc1", [ep("10.180.0.1")], TCP80)])
    fw, ext = f"KUBE-FW-{SVC1}", f"KUBE-EXT-{SVC1}"
    head = f'-A {fw} -m comment --comment "ns1/svc1:p80 loadbalancer IP"'
    assert t["nat"][fw] == [
        f"{head} -s 192.168.0.0/24 -j {ext}", f"{head} -s 203.0.113.0/25 -j {ext}",
        f"{head} -s 1.2.3.4 -j {ext}", f"{head} -s 5.6.7.8 -j {ext}",
        f'-A {fw} -m comment --comment "other traffic to ns1/svc1:p80 will be dropped by'
        ' KUBE-PROXY-FIREWALL"',
    ]
    assert t["filter"]["KUBE-PROXY-FIREWALL"] == [
        f'-A KUBE-PROXY-FIREWALL -m comment --comment "ns1/svc1:p80 traffic not accepted by {fw}"'
        f" -m tcp -p tcp -d {ip} --dport 80 -j DROP" for ip in ("1.2.3.4", "5.6.7.8")]
    assert next(r for r in t["nat"]["KUBE-SERVICES"] if "loadbalancer" in r).endswith(f"-j {fw}")


def test_masquerade_rule_random_fully() -> None:
    """TestMasqueradeRule: --random-fully when iptables has it; the mark is Go's %#08x by default."""
    post = chains([], IptablesConfig())["nat"]["KUBE-POSTROUTING"]
    assert post == [
        "-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE'
        " --random-fully",
    ]


def test_drop_invalid_rule() -> None:
    """TestDropInvalidRule: INVALID is dropped (counted with nfacct) unless tcp_be_liberal is set."""
    forward = chains([], replace(FAKE, nfacct=False))["filter"]["KUBE-FORWARD"]
    assert forward[0] == "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"
    assert len(chains([], replace(FAKE, conntrack_tcp_be_liberal=True))["filter"]["KUBE-FORWARD"]) == 2


def test_kube_firewall_only_with_ipv4_localhost_nodeports() -> None:
    """TestNodePorts: KUBE-FIREWALL is written only for IPv4 with localhost NodePorts."""
    assert "KUBE-FIREWALL" in chains([])["filter"]
    assert "KUBE-FIREWALL" not in chains([], replace(FAKE, localhost_nodeports=False))["filter"]
    assert "KUBE-FIREWALL" not in chains([], FAKE.for_family(IPFamily.IPv6))["filter"]


def test_nodeport_addresses_rules() -> None:
    """Explicit NodePort addresses give one tail call per matching local IP, loopback skipped when off."""
    cfg = replace(FAKE, localhost_nodeports=False, nodeport_addresses=("192.168.0.0/24", "127.0.0.1/32"))
    tail = chains([], cfg)["nat"]["KUBE-SERVICES"]
    assert tail == ['-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must'
                    ' be the last rule in this chain" -d 192.168.0.2 -j KUBE-NODEPORTS']


def test_ipv6_rules() -> None:
    """IPv6: bracketed DNAT targets, the v6 pod CIDR, ::1 excluded from NodePorts, no localhost rules."""
    svc = service("ns1", "svc1", "fd00:172:30::41", [port("p80", 80, nodePort=3001)], type="NodePort")
    eps = endpoint_slice("ns1", "svc1", [ep("fd00:10:180::1"), ep("fd00:10:180::2:1", TEST_NODE)], TCP80,
                         family="IPv6")
    t = chains([svc, eps], FAKE.for_family(IPFamily.IPv6))
    seps = [c for c in t["nat"] if c.startswith("KUBE-SEP-")]
    dnat = sorted(t["nat"][c][1].rsplit(" ", 1)[1] for c in seps)
    assert dnat == ["[fd00:10:180::1]:80", "[fd00:10:180::2:1]:80"]
    assert t["nat"][f"KUBE-SVC-{SVC1}"][0].endswith("--dport 80 ! -s fd00:10::/64 -j KUBE-MARK-MASQ")
    assert t["nat"]["KUBE-SERVICES"][-1].endswith("--dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS")
    assert t["nat"]["KUBE-NODEPORTS"] == [
        f"-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-{SVC1}"]


def large_docs(extra: bool) -> list[dict[str, Any]]:
    """TestSyncProxyRulesLargeClusterMode: 2 x 499 endpoints, then 3 more on svc3."""
    docs = [service("ns1", "svc1", "172.30.0.41", [port("p80", 80)]),
            service("ns2", "svc2", "172.30.0.42", [port("p8080", 8080)]),
            service("ns3", "svc3", "172.30.0.43", [port("p8081", 8081)]),
            endpoint_slice("ns1", "svc1", [ep(f"10.0.{i % 256}.{i // 256}") for i in range(499)], TCP80),
            endpoint_slice("ns2", "svc2", [ep(f"10.1.{i % 256}.{i // 256}") for i in range(499)],
                           [("p8080", 8080, "TCP")])]
    if extra:
        docs.append(endpoint_slice("ns3", "svc3", [ep(f"203.0.113.{i}") for i in (4, 8, 12)],
                                   [("p8081", 8081, "TCP")]))
    return docs


def test_large_cluster_mode_drops_endpoint_comments() -> None:
    """Above 1000 endpoints the SVC and SEP rules lose their comments; at 998 they keep them."""
    cfg = replace(FAKE, masquerade_all=True)
    small = render_full(snapshot_of(large_docs(False)), cfg)
    assert ("-A KUBE-SEP-DKGQUZGBKLTPAR56 -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT"
            " --to-destination 10.0.0.0:80\n") in small
    first = snapshot_of(large_docs(False))
    second = next_snapshot(first, large_docs(True))
    partial = render_partial(first, second, cfg)
    assert "-A KUBE-SEP-RUVVH7YV3PHQBDOS -m tcp -p tcp -j DNAT --to-destination 203.0.113.4:8081\n" in partial
    full = render_full(second, cfg)
    assert "-A KUBE-SEP-DKGQUZGBKLTPAR56 -m tcp -p tcp -j DNAT --to-destination 10.0.0.0:80\n" in full
    assert sum(line.startswith("-A KUBE-SEP-") and "--comment" in line for line in full.splitlines()) == 0
    assert '-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP"' in full
