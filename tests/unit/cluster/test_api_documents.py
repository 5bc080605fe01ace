"""The API documents: selectors, discovery, Tables."""

from __future__ import annotations

import pytest

from kproxy.cluster import api
from kproxy.cluster.store import RESOURCES
from kproxy.errors import InvalidArgument

_OBJ = {"metadata": {"name": "web", "namespace": "demo", "labels": {"app": "web", "tier": "front"}},
        "spec": {"clusterIP": "None"}}


@pytest.mark.parametrize(("selector", "expected"), [
    ("", True), ("app=web", True), ("app==web", True), ("app!=web", False), ("app", True),
    ("!app", False), ("!missing", True), ("tier in (front,back)", True), ("tier notin (front)", False),
    ("app=web,tier=back", False), ("!service.kubernetes.io/headless", True),
])
def test_label_selectors_match_as_the_api_does(selector: str, expected: bool) -> None:
    """Each requirement form of the label selector grammar matches as the API server's."""
    assert api.label_matcher(selector)(_OBJ) is expected


def test_field_selectors_on_name_namespace_and_cluster_ip() -> None:
    """kube-proxy's field selector spec.clusterIP!=None and metadata.name=X work."""
    assert api.field_matcher("spec.clusterIP!=None")(_OBJ) is False
    assert api.field_matcher("metadata.name=web,metadata.namespace=demo")(_OBJ) is True
    with pytest.raises(InvalidArgument, match="not supported"):
        api.field_matcher("spec.type=ClusterIP")


def test_bad_label_selector_is_refused() -> None:
    """A requirement that does not parse is an InvalidArgument (the API's 400)."""
    with pytest.raises(InvalidArgument):
        api.label_matcher("a in b")


def test_discovery_lists_every_served_resource_both_ways() -> None:
    """Legacy and aggregated discovery name the same resources, and pods/portforward."""
    legacy = {r["name"] for r in api.api_resource_list("", "v1")["resources"]}  # type: ignore[index]
    legacy |= {r["name"] for r in api.api_resource_list("discovery.k8s.io", "v1")["resources"]}  # type: ignore[index]
    assert legacy == set(RESOURCES) | {"pods/portforward"}
    agg = api.aggregated_discovery(True, "v2")["items"] + api.aggregated_discovery(False, "v2")["items"]
    names = {r["resource"] for g in agg for v in g["versions"] for r in v["resources"]}
    assert names == set(RESOURCES)
    assert api.api_resource_list("apps", "v1") is None


def test_table_rows_carry_kubectls_columns() -> None:
    """A Service Table has kubectl's columns and one row per object."""
    svc = {"metadata": {"name": "web", "namespace": "demo"},
           "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10",
                    "ports": [{"port": 80, "protocol": "TCP"}]}}
    table = api.table_document(RESOURCES["services"], 7, [svc])
    assert [c["name"] for c in table["columnDefinitions"]][:5] == [
        "Name", "Type", "Cluster-IP", "External-IP", "Port(s)"]
    assert table["rows"][0]["cells"][:5] == ["web", "ClusterIP", "10.96.0.10", "<none>", "80/TCP"]
    assert table["metadata"]["resourceVersion"] == "7"
