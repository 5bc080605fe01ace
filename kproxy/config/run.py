"""The run configuration: one frozen, typed value that ``run``, ``render``, ``trace`` and ``verify`` share.

It is built once (:func:`kproxy.config.build.build_run_config`) from the flags given on the
command line, the KubeProxyConfiguration file (``--config``) and the environment, validated
there, and then only read: the daemon, the modes (``IptablesConfig.from_run``,
``IpvsConfig.from_run``) and the trace builder take their settings from it. Durations are float
seconds. Defaults live in :mod:`kproxy.config.defaults`.

Each section groups what one part reads: :class:`SourceSettings` (where objects come from),
:class:`NodeSettings` (this node, the same in every command), :class:`RuleSettings` (kube-proxy's
flags that shape the programmed rules), :class:`SyncSettings`, :class:`UserspaceSettings` and
:class:`ObservabilitySettings` (``run`` only).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from enum import StrEnum

from kproxy.config.defaults import (
    DEFAULT_BPF_LB_ALGORITHM,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_HEALTHCHECK_BIND_ADDRESSES,
    DEFAULT_HEALTHZ_BIND_ADDRESS,
    DEFAULT_IP_FAMILIES,
    DEFAULT_IPVS_SCHEDULER,
    DEFAULT_LOCALHOST_NODEPORTS,
    DEFAULT_LOOPBACK_BLOCK,
    DEFAULT_MAGLEV_HASH_SEED,
    DEFAULT_MAGLEV_TABLE_SIZE,
    DEFAULT_MASQUERADE_BIT,
    DEFAULT_METRICS_BIND_ADDRESS,
    DEFAULT_MIN_SYNC_PERIOD_S,
    DEFAULT_RUN_MODE,
    DEFAULT_SYNC_PERIOD_S,
    DEFAULT_UDP_TIMEOUT_S,
    STDIN_PATH,
)
from kproxy.model.names import IPFamily
from kproxy.model.snapshot import NodeConfig

__all__ = [
    "DEFAULT_INGRESS_CLASS",
    "Command",
    "IngressSettings",
    "Kernel",
    "LogFormat",
    "LogLevel",
    "NodeSettings",
    "ObservabilitySettings",
    "RuleSettings",
    "RunConfig",
    "SourceSettings",
    "SyncSettings",
    "UserspaceSettings",
]


class Command(StrEnum):
    """The ``kproxy`` subcommand a configuration is built for."""

    RUN = "run"
    RENDER = "render"
    TRACE = "trace"
    VERIFY = "verify"


class Kernel(StrEnum):
    """``--kernel``: which kernel a kernel mode programs."""

    EMULATED = "emulated"
    LINUX = "linux"


class LogFormat(StrEnum):
    """``--log-format``."""

    CONSOLE = "console"
    JSON = "json"


class LogLevel(StrEnum):
    """``--log-level``."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceSettings:
    """Where Services and EndpointSlices come from.

    Attributes:
        manifests: ``--manifests``/``-f`` paths in order; ``"-"`` is standard input.
        kubeconfig: ``--kubeconfig`` (or the file's ``clientConnection.kubeconfig`` when no
            ``--manifests`` flag was given), or None.
        master: ``--master``, or None.
        service_proxy_name: ``--service-proxy-name``, or None (kube-proxy's default).
    """

    manifests: tuple[str, ...] = ()
    kubeconfig: str | None = None
    master: str | None = None
    service_proxy_name: str | None = None

    @property
    def reads_stdin(self) -> bool:
        """``--manifests -``: the objects are read from standard input."""
        return STDIN_PATH in self.manifests

    @property
    def cluster(self) -> bool:
        """A cluster source was asked for (``--kubeconfig`` or ``--master``)."""
        return self.kubeconfig is not None or self.master is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSettings:
    """This node, as every command sees it.

    Attributes:
        hostname: the node name: ``--hostname-override``, else the file's ``hostnameOverride``,
            else ``NODE_NAME`` (kube-proxy's DaemonSet passes it), else the host name; lower case.
        hostname_from: what set it (a flag, ``--config FILE: hostnameOverride``, ``NODE_NAME``
            or ``the host name``).
        node_ips: ``--node-ip`` values in order, canonical; several per family are allowed
            (kube-proxy's fixtures have them) and the first of a family is its primary IP.
        zone: ``--node-zone`` (topology hints), or None (a cluster source reads the Node's label).
        ip_families: the families proxied, primary first: ``--ip-families``/``--ip-family``,
            else those of ``node_ips`` in order, else IPv4 and IPv6.
        ip_families_given: the families came from a flag.
    """

    hostname: str
    hostname_from: str = "--hostname-override"
    node_ips: tuple[str, ...] = ()
    zone: str | None = None
    ip_families: tuple[IPFamily, ...] = DEFAULT_IP_FAMILIES
    ip_families_given: bool = False

    def primary_ip(self, family: IPFamily) -> str | None:
        """The first ``--node-ip`` of ``family`` (kube-proxy's ``nodeIP`` of that proxier), or None."""
        version = 6 if family is IPFamily.IPv6 else 4
        return next((ip for ip in self.node_ips if ipaddress.ip_address(ip).version == version), None)

    def primary_ips(self) -> tuple[str, ...]:
        """The primary IP of each family that has one, in ``node_ips`` order."""
        out: list[str] = []
        versions: set[int] = set()
        for ip in self.node_ips:
            version = ipaddress.ip_address(ip).version
            if version not in versions:
                versions.add(version)
                out.append(ip)
        return tuple(out)

    def node_config(self, service_proxy_name: str | None = None) -> NodeConfig:
        """The model's view of this node."""
        return NodeConfig(hostname=self.hostname, zone=self.zone, ip_families=self.ip_families,
                          service_proxy_name=service_proxy_name)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleSettings:
    """kube-proxy's settings that shape what a mode programs.

    Attributes:
        proxy_mode: ``--proxy-mode``, else the file's ``mode``, else the command's default.
        cluster_cidrs: ``--cluster-cidr`` (or ``clusterCIDR``), at most one per family.
        masquerade_all: ``--masquerade-all`` (or ``iptables.masqueradeAll``).
        masquerade_bit: ``--iptables-masquerade-bit`` (or ``iptables.masqueradeBit``), 0..31.
        nodeport_addresses: ``--nodeport-addresses`` (or ``nodePortAddresses``): CIDRs in
            canonical spelling, or ``("primary",)``; empty means every local address.
        localhost_nodeports: ``--iptables-localhost-nodeports`` (or ``iptables.localhostNodePorts``).
        ipvs_scheduler: ``--ipvs-scheduler`` (or ``ipvs.scheduler``).
        bpf_lb_algorithm: ``--bpf-lb-algorithm`` (ebpf mode, Cilium's): ``random`` or ``maglev``.
        bpf_lb_maglev_table_size: ``--bpf-lb-maglev-table-size``, one of Cilium's primes.
        bpf_lb_maglev_hash_seed: ``--bpf-lb-maglev-hash-seed``, base64 of 12 bytes.
        service_cidrs: ``--service-cidr``: the ranges ClusterIPs come from, canonical CIDRs of
            either family (the nftables mode drops traffic to their unallocated addresses).
        kernel: ``--kernel`` (``run``'s kernel modes).
    """

    proxy_mode: str = DEFAULT_RUN_MODE
    cluster_cidrs: tuple[str, ...] = ()
    masquerade_all: bool = False
    masquerade_bit: int = DEFAULT_MASQUERADE_BIT
    nodeport_addresses: tuple[str, ...] = ()
    localhost_nodeports: bool = DEFAULT_LOCALHOST_NODEPORTS
    ipvs_scheduler: str = DEFAULT_IPVS_SCHEDULER
    bpf_lb_algorithm: str = DEFAULT_BPF_LB_ALGORITHM
    bpf_lb_maglev_table_size: int = DEFAULT_MAGLEV_TABLE_SIZE
    bpf_lb_maglev_hash_seed: str = DEFAULT_MAGLEV_HASH_SEED
    service_cidrs: tuple[str, ...] = ()
    kernel: Kernel = Kernel.EMULATED


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncSettings:
    """The bounded-frequency runner's bounds, in seconds (``--min-sync-period``, ``--sync-period``)."""

    min_sync_period_s: float = DEFAULT_MIN_SYNC_PERIOD_S
    sync_period_s: float = DEFAULT_SYNC_PERIOD_S


@dataclass(frozen=True, slots=True, kw_only=True)
class UserspaceSettings:
    """The userspace data plane's flags.

    Attributes:
        bind_address: ``--bind-address``, or None (one loopback address per Service).
        loopback_block: ``--loopback-block``, an IPv4 CIDR.
        address_map: ``--address-map`` file, or None.
        udp_timeout_s: ``--udp-timeout``, seconds (> 0).
        drain_timeout_s: ``--drain-timeout``, seconds (>= 0).
        max_connections, max_connections_per_service: ``--max-connections`` and
            ``--max-connections-per-service``, relayed TCP connections open at once in total and
            on one service port, or None (sized from RLIMIT_NOFILE at start-up).
        max_udp_sessions, max_udp_sessions_per_service: ``--max-udp-sessions`` and
            ``--max-udp-sessions-per-service``, the same for UDP sessions.
    """

    bind_address: str | None = None
    loopback_block: str = DEFAULT_LOOPBACK_BLOCK
    address_map: str | None = None
    udp_timeout_s: float = DEFAULT_UDP_TIMEOUT_S
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    max_connections: int | None = None
    max_connections_per_service: int | None = None
    max_udp_sessions: int | None = None
    max_udp_sessions_per_service: int | None = None


#: ``--ingress-class``'s default: ingress-nginx's class, so existing manifests work unchanged.
DEFAULT_INGRESS_CLASS = "nginx"


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressSettings:
    """The HTTP (layer 7) plane's flags.

    Attributes:
        bind_address: ``--ingress-bind-address`` as ``(ip, port)``, or None (no listener).
        ingress_class: ``--ingress-class``: the Ingress class served.
    """

    bind_address: tuple[str, int] | None = None
    ingress_class: str = DEFAULT_INGRESS_CLASS


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservabilitySettings:
    """Health and metrics addresses.

    Attributes:
        healthz_bind_address, metrics_bind_address: ``IP:PORT``; ``""`` disables.
        healthz_from, metrics_from: what an error about the address names: the flag, or the
            file and field it came from.
        healthcheck_bind_addresses: the IPs health check node ports listen on.
    """

    healthz_bind_address: str = DEFAULT_HEALTHZ_BIND_ADDRESS
    metrics_bind_address: str = DEFAULT_METRICS_BIND_ADDRESS
    healthz_from: str = "--healthz-bind-address"
    metrics_from: str = "--metrics-bind-address"
    healthcheck_bind_addresses: tuple[str, ...] = DEFAULT_HEALTHCHECK_BIND_ADDRESSES


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """Everything one ``kproxy`` command runs with (see the module docstring).

    Attributes:
        command: the subcommand it was built for.
        source, node, rules, sync, userspace, observability: the sections.
        log_format, log_level: ``--log-format`` and ``--log-level``.
        config_file: ``--config``, or None.
        given: the flags given on the command line (kube-proxy's names, ``--node-ip``).
        ignored_flags: flags given that the chosen mode does not use, to be warned about.
        unhonoured_fields: ``--config`` fields set to a non-default value that kproxy cannot
            honour in this mode, to be warned about (``run`` only).
        notes: other things worth one log line (a file setting a flag overrode).
    """

    command: Command
    source: SourceSettings = field(default_factory=SourceSettings)
    node: NodeSettings
    rules: RuleSettings = field(default_factory=RuleSettings)
    sync: SyncSettings = field(default_factory=SyncSettings)
    userspace: UserspaceSettings = field(default_factory=UserspaceSettings)
    observability: ObservabilitySettings = field(default_factory=ObservabilitySettings)
    ingress: IngressSettings = field(default_factory=IngressSettings)
    log_format: LogFormat = LogFormat.CONSOLE
    log_level: LogLevel = LogLevel.INFO
    config_file: str | None = None
    given: frozenset[str] = frozenset()
    ignored_flags: tuple[str, ...] = ()
    unhonoured_fields: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def proxy_mode(self) -> str:
        """The proxy mode (``rules.proxy_mode``)."""
        return self.rules.proxy_mode

    @property
    def primary_family(self) -> IPFamily:
        """The first family proxied (what ``render`` renders)."""
        return self.node.ip_families[0]
