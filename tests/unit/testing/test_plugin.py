# ruff: noqa: E501  (cluster literals and test names are kept whole to stay readable)
"""The pytest plugin: the --kproxy-modes option and a running in-process cluster fixture."""

from __future__ import annotations

import pytest

import kproxy.testing
from kproxy.errors import InvalidArgument
from kproxy.testing import DEFAULT_MODES, InProcessCluster
from kproxy.testing.plugin import parse_modes


def test_parse_modes_defaults_and_validates() -> None:
    """No value gives the default modes; an unknown or repeated mode raises naming it."""
    assert parse_modes(None) == DEFAULT_MODES
    assert parse_modes("iptables, userspace") == ("iptables", "userspace")
    with pytest.raises(InvalidArgument, match="nope"):
        parse_modes("userspace,nope")
    with pytest.raises(InvalidArgument, match="twice"):
        parse_modes("iptables,iptables")


def test_the_modes_fixture_holds_the_chosen_modes(kproxy_modes: tuple[str, ...]) -> None:
    """The session fixture gives registered mode names (the plugin is loaded through pytest11)."""
    assert kproxy_modes and set(kproxy_modes) <= set(kproxy.testing.available_modes())


async def test_the_cluster_fixture_serves_scales_and_removes_services(kproxy_cluster: InProcessCluster) -> None:
    """A Service added with two backends is served round robin; scaled to one, only it answers; removed, gone."""
    web = await kproxy_cluster.add_service("demo/web", (80,), replicas=2)
    backends = await kproxy_cluster.scale(web, 2)
    answers = {await kproxy_cluster.request(web) for _ in range(4)}
    assert answers == set(backends)
    (only,) = await kproxy_cluster.scale(web, 1)
    assert {await kproxy_cluster.request(web) for _ in range(3)} == {only}
    await kproxy_cluster.remove_service(web)
    with pytest.raises(LookupError):
        kproxy_cluster.address(web)


async def test_the_cluster_fixture_serves_udp(kproxy_cluster: InProcessCluster) -> None:
    """A UDP Service's datagrams reach its backend and the answer names it."""
    dns = await kproxy_cluster.add_service("demo/dns", (53,), replicas=1, protocol="UDP")
    (backend,) = await kproxy_cluster.scale(dns, 1, protocol="UDP")
    assert await kproxy_cluster.request(dns, protocol="UDP") == backend


def test_the_public_surface_is_exported_sorted_and_documented() -> None:
    """kproxy.testing.__all__ names each export once (ruff keeps it sorted), each exists and is documented."""
    names = kproxy.testing.__all__
    assert len(names) == len(set(names))
    assert all(hasattr(kproxy.testing, n) for n in names)
    assert all(getattr(kproxy.testing, n).__doc__ for n in names if callable(getattr(kproxy.testing, n)))
