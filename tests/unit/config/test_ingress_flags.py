"""--ingress-bind-address and --ingress-class in the run configuration."""

from __future__ import annotations

import pytest

from kproxy.config import Command, build_run_config
from kproxy.errors import ConfigError


def _build(**given: str):  # type: ignore[no-untyped-def]
    flags = {f"--{k.replace('_', '-')}": v for k, v in given.items()}
    return build_run_config({"--hostname-override": "n", **flags}, command=Command.RUN,
                            modes=("userspace",), environ={})


def test_no_listener_and_class_nginx_by_default() -> None:
    """Without the flag there is no listener; the class defaults to ingress-nginx's."""
    run = _build()
    assert run.ingress.bind_address is None and run.ingress.ingress_class == "nginx"


def test_ipv4_and_bracketed_ipv6_addresses() -> None:
    """IP:PORT, with brackets around an IPv6 address."""
    assert _build(ingress_bind_address="127.0.0.1:8080").ingress.bind_address == ("127.0.0.1", 8080)
    assert _build(ingress_bind_address="[::1]:80").ingress.bind_address == ("::1", 80)
    assert _build(ingress_class="haproxy").ingress.ingress_class == "haproxy"


@pytest.mark.parametrize("bad", ["127.0.0.1", "localhost:80", "127.0.0.1:70000", "::1:80", "1.2.3.4:x"])
def test_a_bad_address_names_the_flag(bad: str) -> None:
    """Anything but IP:PORT is refused with the flag's name."""
    with pytest.raises(ConfigError, match="--ingress-bind-address"):
        _build(ingress_bind_address=bad)
