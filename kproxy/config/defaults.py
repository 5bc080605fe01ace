"""Every default of a kproxy run, in one place (seconds for durations).

kube-proxy's own defaults come from ``pkg/proxy/apis/config/v1alpha1/defaults.go`` and its flag
definitions (``cmd/kube-proxy/app/options.go``); kproxy's are marked as such where they differ
(the health address binds loopback, the userspace mode's settings are kproxy's own, after the
former userspace proxier of kube-proxy 1.2-1.25). The run configuration
(:mod:`kproxy.config.run`), the daemon's option classes and the mode configurations all read
their defaults from here.
"""

from __future__ import annotations

from kproxy.model.names import IPFamily

__all__ = [
    "BPF_LB_ALGORITHMS",
    "DEFAULT_BPF_LB_ALGORITHM",
    "DEFAULT_DRAIN_TIMEOUT_S",
    "DEFAULT_HEALTHCHECK_BIND_ADDRESSES",
    "DEFAULT_HEALTHZ_BIND_ADDRESS",
    "DEFAULT_IPVS_SCHEDULER",
    "DEFAULT_IP_FAMILIES",
    "DEFAULT_KERNEL",
    "DEFAULT_LOCALHOST_NODEPORTS",
    "DEFAULT_LOG_FORMAT",
    "DEFAULT_LOG_LEVEL",
    "DEFAULT_LOOPBACK_BLOCK",
    "DEFAULT_MAGLEV_HASH_SEED",
    "DEFAULT_MAGLEV_TABLE_SIZE",
    "DEFAULT_MASQUERADE_BIT",
    "DEFAULT_METRICS_BIND_ADDRESS",
    "DEFAULT_MIN_SYNC_PERIOD_S",
    "DEFAULT_RENDER_MODE",
    "DEFAULT_RUN_MODE",
    "DEFAULT_SYNC_PERIOD_S",
    "DEFAULT_UDP_TIMEOUT_S",
    "HEALTHZ_PORT",
    "MAGLEV_TABLE_SIZES",
    "METRICS_PORT",
    "STDIN_PATH",
]

#: ``--min-sync-period``: kube-proxy's ``iptables.minSyncPeriod`` default (1 s).
DEFAULT_MIN_SYNC_PERIOD_S = 1.0
#: ``--sync-period``: kube-proxy's ``iptables.syncPeriod`` default (30 s).
DEFAULT_SYNC_PERIOD_S = 30.0
#: ``--iptables-masquerade-bit``: kube-proxy's default, 14 (mark ``0x4000``).
DEFAULT_MASQUERADE_BIT = 14
#: ``--iptables-localhost-nodeports``: kube-proxy's default, true.
DEFAULT_LOCALHOST_NODEPORTS = True
#: ``--ipvs-scheduler``: kube-proxy's ``defaultScheduler`` in ``pkg/proxy/ipvs/proxier.go``.
DEFAULT_IPVS_SCHEDULER = "rr"
#: kube-proxy's ``ports.ProxyHealthzPort`` and ``ports.ProxyStatusPort``.
HEALTHZ_PORT = 10256
METRICS_PORT = 10249
#: ``--healthz-bind-address``: kproxy binds loopback (kube-proxy's default is ``0.0.0.0:10256``).
DEFAULT_HEALTHZ_BIND_ADDRESS = f"127.0.0.1:{HEALTHZ_PORT}"
#: ``--metrics-bind-address``: kube-proxy's default.
DEFAULT_METRICS_BIND_ADDRESS = f"127.0.0.1:{METRICS_PORT}"
#: ``--healthcheck-bind-addresses``: kproxy's; kube-proxy binds every node address.
DEFAULT_HEALTHCHECK_BIND_ADDRESSES = ("127.0.0.1",)
#: ``--ip-families`` without ``--node-ip``: both, IPv4 first (with ``--node-ip``: their families).
DEFAULT_IP_FAMILIES = (IPFamily.IPv4, IPFamily.IPv6)
#: ``kproxy run --proxy-mode``: kproxy's rootless default (the file's ``mode: ""`` means it too).
DEFAULT_RUN_MODE = "userspace"
#: ``kproxy render|trace --proxy-mode``: kube-proxy's default mode on Linux.
DEFAULT_RENDER_MODE = "iptables"
#: ``--kernel``: the emulated kernel, rootless.
DEFAULT_KERNEL = "emulated"
#: ``--loopback-block``: the userspace mode's per-Service addresses.
DEFAULT_LOOPBACK_BLOCK = "127.0.0.0/8"
#: ``--udp-timeout``: idle timeout of a userspace UDP session (the former userspace proxier's 250 ms
#: was per read; kproxy keeps sessions, as conntrack's ``nf_conntrack_udp_timeout_stream`` is 120 s).
DEFAULT_UDP_TIMEOUT_S = 30.0
#: ``--drain-timeout``: how long open userspace connections may finish on SIGINT/SIGTERM.
DEFAULT_DRAIN_TIMEOUT_S = 10.0
#: ``--log-format`` and ``--log-level``.
DEFAULT_LOG_FORMAT = "console"
DEFAULT_LOG_LEVEL = "info"
#: The ``--manifests`` (``-f``) value meaning standard input, as kubectl's ``-f -``.
STDIN_PATH = "-"
#: ``--bpf-lb-algorithm``: Cilium's ``loadBalancer.algorithm`` values and default (``random``).
BPF_LB_ALGORITHMS = ("random", "maglev")
DEFAULT_BPF_LB_ALGORITHM = "random"
#: ``--bpf-lb-maglev-table-size``: Cilium's ``maglev.DefaultTableSize`` and the only sizes it
#: accepts (``maglevSupportedTableSizes``, primes).
DEFAULT_MAGLEV_TABLE_SIZE = 16381
MAGLEV_TABLE_SIZES = (251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071)
#: ``--bpf-lb-maglev-hash-seed``: Cilium's ``maglev.DefaultHashSeed`` (base64 of 12 bytes).
DEFAULT_MAGLEV_HASH_SEED = "JLfvgnHc2kaSUFaI"
