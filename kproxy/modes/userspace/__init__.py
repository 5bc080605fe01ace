"""The userspace data plane: a pure balancer, address allocation, TCP and UDP relays.

:class:`UserspaceProxy` is the entry point: ``await proxy.apply(snapshot)`` on every sync,
``await proxy.aclose(drain_timeout_s)`` at the end. The rest is exported for the equivalence
checks (:class:`RoundRobinBalancer`), for tools that print where Services listen
(:func:`allocate_addresses`, :class:`AddressEntry`), for start-up checks of the flags
(:func:`check_bind_address`, :func:`check_loopback_block`), for metrics (the stats classes) and
for the caps on what the data plane holds open (:class:`ConnectionLimits`).
"""

from kproxy.modes.userspace.addresses import (
    DEFAULT_LOOPBACK_BLOCK,
    ListenPlan,
    allocate_addresses,
    bind_socket,
    bind_sockets,
    check_bind_address,
    check_loopback_block,
    plan_listen,
    split_host_port,
)
from kproxy.modes.userspace.balancer import DEFAULT_AFFINITY_TTL_S, RoundRobinBalancer
from kproxy.modes.userspace.limits import ConnectionLimits
from kproxy.modes.userspace.proxy import AddressEntry, UserspaceProxy
from kproxy.modes.userspace.tcp import DEFAULT_DIAL_TIMEOUTS_S, TcpConnectionInfo, TcpListener, TcpStats
from kproxy.modes.userspace.udp import DEFAULT_UDP_IDLE_TIMEOUT_S, UdpListener, UdpStats

__all__ = [
    "DEFAULT_AFFINITY_TTL_S",
    "DEFAULT_DIAL_TIMEOUTS_S",
    "DEFAULT_LOOPBACK_BLOCK",
    "DEFAULT_UDP_IDLE_TIMEOUT_S",
    "AddressEntry",
    "ConnectionLimits",
    "ListenPlan",
    "RoundRobinBalancer",
    "TcpConnectionInfo",
    "TcpListener",
    "TcpStats",
    "UdpListener",
    "UdpStats",
    "UserspaceProxy",
    "allocate_addresses",
    "bind_socket",
    "bind_sockets",
    "check_bind_address",
    "check_loopback_block",
    "plan_listen",
    "split_host_port",
]
