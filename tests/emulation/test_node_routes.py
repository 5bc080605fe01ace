"""Routes of the emulated node: their family follows their destination and gateway."""

from __future__ import annotations

import pytest

from emulation.node import Route


def test_an_ipv6_route_is_an_ipv6_route() -> None:
    """``Route(destination="default", via="fd00::1")`` was an IPv4 route: every IPv6 packet
    was then unreachable."""
    assert Route(destination="default", device="eth0", via="fd00::1").version == 6
    assert Route(destination="fd00::/8", device="eth0").version == 6
    assert Route(destination="default", device="eth0", via="192.168.0.1").version == 4
    with pytest.raises(ValueError):
        Route(destination="10.0.0.0/8", device="eth0", version=6)
    with pytest.raises(ValueError):
        Route(destination="10.0.0.0/8", device="eth0", via="fd00::1")
