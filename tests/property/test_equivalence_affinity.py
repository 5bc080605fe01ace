# ruff: noqa: E501  (cluster literals and test names are kept whole to stay readable)
"""Properties: session affinity and load-balancer source ranges hold in every mode.

Example counts are for the ``ci`` profile; ``HYPOTHESIS_PROFILE=thorough`` multiplies them by 20.
"""

from __future__ import annotations

import ipaddress
import os

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kproxy.model import Protocol
from kproxy.testing import (
    Cluster,
    Origin,
    Target,
    affinity_holds,
    clusters,
    endpoint_slices,
    get_mode,
    packets,
    services,
)
from kproxy.testing.differences import applicable_differences

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"


RANGES = (["203.0.113.0/25"], ["203.0.113.0/26", "2001:db8:203::/80"], ["10.244.0.0/16", "fd00:10:244::/48"],
          ["198.51.100.0/24"])
LB_IPS = {False: "198.51.100.1", True: "2001:db8:100::1"}


def scaled(n: int) -> int:
    """``n`` examples under the ci profile, 20 times more under ``thorough``."""
    return n * 20 if THOROUGH else n


@settings(max_examples=scaled(120), deadline=None, derandomize=not THOROUGH)
@given(st.data())
def test_affinity_keeps_a_client_on_its_endpoint_within_the_timeout(
        kproxy_modes: tuple[str, ...], data: st.DataObject) -> None:
    """Within the timeout a client's next connection reaches its endpoint in every mode; after it, any endpoint."""
    cluster = data.draw(clusters(max_services=2, session_affinity=True, protocols=("TCP", "UDP"),
                                 min_services=1), label="cluster")
    packet = data.draw(packets(cluster, targets=(Target.CLUSTER_IP,)), label="packet")
    info = next(i for i in cluster.snapshot if i.cluster_ip == packet.dst and i.port == packet.dport
                and i.protocol is packet.protocol)
    assume(info.internal_endpoints and info.protocol is not Protocol.SCTP)
    timeout = info.session_affinity_timeout_s
    assert timeout is not None
    within = data.draw(st.floats(min_value=0, max_value=timeout * 0.99), label="within_s")
    after = data.draw(st.floats(min_value=timeout + 1, max_value=timeout * 3 + 10), label="after_s")
    reachable = {ep.address for ep in info.internal_endpoints}
    for mode in kproxy_modes:
        first, second, third = get_mode(mode).connections(cluster, packet, [0.0, within, within + after])
        assert first in reachable, (mode, first)
        assert affinity_holds(mode, within, timeout)
        assert second == first, f"{mode}: affinity broke after {within}s of {timeout}s"
        assert third in reachable, (mode, third)


@settings(max_examples=scaled(60), deadline=None, derandomize=not THOROUGH)
@given(st.data())
def test_expired_affinity_lets_every_endpoint_be_chosen(data: st.DataObject) -> None:
    """After the timeout a client's next connections spread over every endpoint again, in every mode."""
    cluster = data.draw(clusters(max_services=1, session_affinity=True, protocols=("TCP",)), label="cluster")
    packet = data.draw(packets(cluster, targets=(Target.CLUSTER_IP,)), label="packet")
    info = next(i for i in cluster.snapshot if i.cluster_ip == packet.dst and i.port == packet.dport
                and i.protocol is packet.protocol)
    assume(len(info.internal_endpoints) >= 2)
    timeout = info.session_affinity_timeout_s
    assert timeout is not None
    reachable = {ep.address for ep in info.internal_endpoints}
    times = [k * (timeout + 1.0) for k in range(40 * len(reachable))]
    for mode in ("userspace", "iptables"):
        chosen = set(get_mode(mode).connections(cluster, packet, times))
        assert chosen == reachable, mode


@settings(max_examples=scaled(150), deadline=None, derandomize=not THOROUGH)
@given(st.data())
def test_clients_outside_the_source_ranges_never_reach_an_endpoint(
        kproxy_modes: tuple[str, ...], data: st.DataObject) -> None:
    """A client outside loadBalancerSourceRanges never reaches an endpoint through the LB IP, in any mode."""
    svc = data.draw(services(types=("LoadBalancer",)), label="service")
    svc["spec"]["loadBalancerSourceRanges"] = data.draw(st.sampled_from(RANGES), label="ranges")
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": LB_IPS[":" in ip]} for ip in svc["spec"]["clusterIPs"]]}}
    cluster = Cluster(manifests=(svc, *data.draw(endpoint_slices(svc), label="slices")))
    packet = data.draw(packets(cluster, targets=(Target.LOAD_BALANCER,),
                               origins=(Origin.EXTERNAL, Origin.REMOTE_POD, Origin.LOCAL_POD, Origin.NODE)),
                       label="packet")
    info = next(i for i in cluster.snapshot if packet.dst in i.load_balancer_ips and i.port == packet.dport
                and i.protocol is packet.protocol)
    ranges = [ipaddress.ip_network(r) for r in info.load_balancer_source_ranges]
    assume(ranges and not any(ipaddress.ip_address(packet.src) in r for r in ranges))
    outcomes = {mode: get_mode(mode).outcome(cluster, packet) for mode in kproxy_modes}
    # The one documented exception: ipvs lets the node itself through (KUBE-PROXY-FIREWALL is not on
    # OUTPUT there, and KUBE-IPVS-OUT-FILTER drops only packets sourced from the LB IP).
    excused = {m for d in applicable_differences(cluster, packet, outcomes)
               if d.name == "ipvs-source-ranges-node-access" for m in d.modes}
    for mode, outcome in outcomes.items():
        if mode not in excused:
            assert not outcome.translated, (mode, outcome)
