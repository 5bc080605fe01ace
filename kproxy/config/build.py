"""Build the run configuration once: flags given, then ``--config``, then the environment, then defaults.

As kube-proxy does (``cmd/kube-proxy/app/server.go``: the file is read first, then the flags
given on the command line override it), a flag given wins over the file's field, and the
file's field over the default. The node name follows kube-proxy's ``--hostname-override``, else
the host name (``nodeutil.GetHostname``: trimmed, lower case); kproxy also reads ``NODE_NAME``,
which kube-proxy's DaemonSet passes as ``--hostname-override=$(NODE_NAME)``, so the same pod spec
works without the flag. Every error is a :class:`~kproxy.errors.ConfigError` naming the flag
(kube-proxy's name) or the file and field the bad value came from.

Pure apart from reading the ``--config`` file and checking that ``--address-map``'s folder exists.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from emulation.ipvs import SCHEDULERS
from kproxy.config.defaults import (
    BPF_LB_ALGORITHMS,
    DEFAULT_BPF_LB_ALGORITHM,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_HEALTHCHECK_BIND_ADDRESSES,
    DEFAULT_HEALTHZ_BIND_ADDRESS,
    DEFAULT_IP_FAMILIES,
    DEFAULT_IPVS_SCHEDULER,
    DEFAULT_LOOPBACK_BLOCK,
    DEFAULT_MAGLEV_HASH_SEED,
    DEFAULT_MAGLEV_TABLE_SIZE,
    DEFAULT_MASQUERADE_BIT,
    DEFAULT_METRICS_BIND_ADDRESS,
    DEFAULT_MIN_SYNC_PERIOD_S,
    DEFAULT_SYNC_PERIOD_S,
    DEFAULT_UDP_TIMEOUT_S,
    MAGLEV_TABLE_SIZES,
    STDIN_PATH,
)
from kproxy.config.flags import (
    CAP_FLAGS,
    EBPF_ONLY_FLAGS,
    IPVS_ONLY_FLAGS,
    KERNEL_ONLY_FLAGS,
    NFTABLES_ONLY_FLAGS,
    RUN_FLAGS,
    USERSPACE_ONLY_FLAGS,
    honoured_fields,
    unhonoured_fields,
)
from kproxy.config.kubeproxy import (
    KubeProxyConfiguration,
    default_configuration,
    load_configuration,
    nodeport_addresses_flag,
)
from kproxy.config.run import (
    DEFAULT_INGRESS_CLASS,
    Command,
    IngressSettings,
    Kernel,
    LogFormat,
    LogLevel,
    NodeSettings,
    ObservabilitySettings,
    RuleSettings,
    RunConfig,
    SourceSettings,
    SyncSettings,
    UserspaceSettings,
)
from kproxy.config.values import (
    parse_bool,
    parse_cidr_list,
    parse_count,
    parse_families,
    parse_ip_list,
    parse_ipv4_cidr,
    parse_node_ips,
    parse_period,
    parse_service_cidrs,
    parse_specific_ip,
)
from kproxy.errors import ConfigError, InvalidArgument
from kproxy.model.names import IPFamily

__all__ = ["build_run_config"]

Given = Mapping[str, Any]


def build_run_config(
    given: Given, *, command: Command, modes: Sequence[str] = (), default_mode: str = "userspace",
    environ: Mapping[str, str] | None = None, gethostname: Callable[[], str] | None = None,
) -> RunConfig:
    """The run configuration of one command (see the module docstring).

    Args:
        given: the flags given on the command line, by kube-proxy's name (``"--node-ip"``), with
            their parsed values: ``str``, ``bool`` (switches), ``int`` or ``list[str]`` (repeated
            or multi-valued flags). A flag left out was not given.
        command: the subcommand.
        modes: the ``--proxy-mode`` values this command takes (the registry's names); empty
            when it takes none.
        default_mode: the mode when neither the flag nor the file's ``mode`` says.
        environ: the environment (default ``os.environ``); ``NODE_NAME`` is read.
        gethostname: the host name (default :func:`socket.gethostname`).

    Returns:
        The frozen :class:`~kproxy.config.run.RunConfig`.

    Raises:
        ConfigError: a bad value (naming the flag, or the file and field), a bad ``--config`` file,
            or a combination that means nothing (``--manifests`` with ``--kubeconfig``).
        InvalidArgument: ``given`` names a flag this builder does not know (a programming error).
    """
    unknown = sorted(set(given) - RUN_FLAGS)
    if unknown:
        raise InvalidArgument(f"build_run_config: unknown flags {unknown}; known: {sorted(RUN_FLAGS)}")
    file = load_configuration(given["--config"]) if given.get("--config") else default_configuration()
    mode = _proxy_mode(given, file, command, tuple(modes), default_mode)
    kernel_mode = mode in ("iptables", "ipvs", "nftables")
    userspace = _userspace(given, check=command is Command.RUN and mode == "userspace")
    unhonoured: tuple[str, ...] = ()
    if command is Command.RUN and given.get("--config"):
        unhonoured = tuple(unhonoured_fields(file, honoured_fields(kernel_mode)))
    source, notes = _source(given, file)
    return RunConfig(
        command=command, source=source, node=_node(given, file, environ, gethostname),
        rules=_rules(given, file, mode), sync=_sync(given, file, mode), userspace=userspace,
        observability=_observability(given, file), ingress=_ingress(given),
        log_format=_enum(LogFormat, given.get("--log-format", LogFormat.CONSOLE.value), "--log-format"),
        log_level=_enum(LogLevel, given.get("--log-level", LogLevel.INFO.value), "--log-level"),
        config_file=given.get("--config") or None, given=frozenset(given),
        ignored_flags=_ignored(given, command, mode), unhonoured_fields=unhonoured, notes=notes)


def _field(file: KubeProxyConfiguration, path: str) -> str:
    return f"{file.source}: {path}" if file.source else path


def _enum(kind: Any, value: str, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise ConfigError(f"{name}: expected one of {choices}, got {value!r}") from None


def _proxy_mode(given: Given, file: KubeProxyConfiguration, command: Command, modes: tuple[str, ...],
                default: str) -> str:
    if not modes:
        return default
    if "--proxy-mode" in given:
        mode = str(given["--proxy-mode"])
        if mode not in modes:
            raise ConfigError(f"--proxy-mode: `kproxy {command}` takes {', '.join(modes)}, got {mode!r}")
        return mode
    if file.mode and file.mode not in modes:
        raise ConfigError(f"{_field(file, 'mode')}: `kproxy {command}` takes {' and '.join(modes)} only, "
                          f"got {file.mode!r} (override with --proxy-mode)")
    return file.mode or default


def _hostname(given: Given, file: KubeProxyConfiguration, environ: Mapping[str, str] | None,
              gethostname: Callable[[], str] | None) -> tuple[str, str]:
    env = os.environ if environ is None else environ
    candidates: list[tuple[str, Callable[[], str]]] = [
        ("--hostname-override", lambda: str(given.get("--hostname-override") or "")),
        (_field(file, "hostnameOverride"), lambda: file.hostname_override),
        ("NODE_NAME", lambda: env.get("NODE_NAME", "")),
        ("the host name", gethostname or socket.gethostname)]
    for origin, read in candidates:
        name = read().strip().lower()
        if name:
            return name, origin
    raise ConfigError("--hostname-override: the node name is empty (no flag, no hostnameOverride, no "
                      "NODE_NAME and an empty host name); pass --hostname-override NAME")


def _node(given: Given, file: KubeProxyConfiguration, environ: Mapping[str, str] | None,
          gethostname: Callable[[], str] | None) -> NodeSettings:
    hostname, origin = _hostname(given, file, environ, gethostname)
    node_ips = parse_node_ips(list(given.get("--node-ip", ())))
    if "--ip-families" in given and "--ip-family" in given:
        raise ConfigError("--ip-family and --ip-families say the same thing: give one of them")
    families: tuple[IPFamily, ...]
    flag = "--ip-families" if "--ip-families" in given else "--ip-family"
    if flag in given:
        families = parse_families(str(given[flag]), name=flag)
    elif node_ips:
        families = tuple(dict.fromkeys(IPFamily.IPv6 if ":" in ip else IPFamily.IPv4 for ip in node_ips))
    else:
        families = DEFAULT_IP_FAMILIES
    zone = given.get("--node-zone")
    return NodeSettings(hostname=hostname, hostname_from=origin, node_ips=node_ips,
                        zone=str(zone).strip() or None if zone is not None else None,
                        ip_families=families, ip_families_given=flag in given)


def _rules(given: Given, file: KubeProxyConfiguration, mode: str) -> RuleSettings:
    doc = file.document
    if "--cluster-cidr" in given:
        cidrs = parse_cidr_list(str(given["--cluster-cidr"]), name="--cluster-cidr")
    else:
        cidrs = parse_cidr_list(file.cluster_cidr, name=_field(file, "clusterCIDR"))
    if "--iptables-masquerade-bit" in given:
        bit = given["--iptables-masquerade-bit"]
        if isinstance(bit, bool) or not isinstance(bit, int) or not 0 <= bit <= 31:
            raise ConfigError(f"--iptables-masquerade-bit: expected 0..31, got {bit!r}")
    else:
        bit = int(doc["iptables"]["masqueradeBit"]) if file.source else DEFAULT_MASQUERADE_BIT
    if "--nodeport-addresses" in given:
        nodeports = nodeport_addresses_flag(str(given["--nodeport-addresses"]))
    else:
        nodeports = file.node_port_addresses
    localhost = given.get("--iptables-localhost-nodeports", doc["iptables"]["localhostNodePorts"])
    if isinstance(localhost, str):
        localhost = parse_bool(localhost, name="--iptables-localhost-nodeports")
    scheduler, scheduler_from = DEFAULT_IPVS_SCHEDULER, "--ipvs-scheduler"
    if "--ipvs-scheduler" in given:
        scheduler = str(given["--ipvs-scheduler"]) or DEFAULT_IPVS_SCHEDULER
    elif doc["ipvs"]["scheduler"]:
        scheduler, scheduler_from = doc["ipvs"]["scheduler"], _field(file, "ipvs.scheduler")
    if scheduler not in SCHEDULERS:
        raise ConfigError(f"{scheduler_from}: expected one of {', '.join(sorted(SCHEDULERS))}, "
                          f"got {scheduler!r}")
    return RuleSettings(
        proxy_mode=mode, cluster_cidrs=cidrs,
        masquerade_all=bool(given.get("--masquerade-all", doc["iptables"]["masqueradeAll"])),
        masquerade_bit=bit, nodeport_addresses=nodeports, localhost_nodeports=bool(localhost),
        ipvs_scheduler=scheduler, **_bpf_lb(given),
        service_cidrs=parse_service_cidrs(str(given.get("--service-cidr", "")), name="--service-cidr"),
        kernel=_enum(Kernel, given.get("--kernel", Kernel.EMULATED.value), "--kernel"))


def _bpf_lb(given: Given) -> dict[str, Any]:
    """Cilium's load-balancing flags of the ebpf mode, validated as Cilium's agent validates them
    (``loadbalancer.algorithm``; ``maglev.UserConfig.ToConfig``)."""
    algorithm = str(given.get("--bpf-lb-algorithm", DEFAULT_BPF_LB_ALGORITHM))
    if algorithm not in BPF_LB_ALGORITHMS:
        raise ConfigError(f"--bpf-lb-algorithm: expected one of {', '.join(BPF_LB_ALGORITHMS)}, "
                          f"got {algorithm!r}")
    size = given.get("--bpf-lb-maglev-table-size", DEFAULT_MAGLEV_TABLE_SIZE)
    if isinstance(size, str) and size.isdigit():
        size = int(size)
    if isinstance(size, bool) or size not in MAGLEV_TABLE_SIZES:
        raise ConfigError(f"--bpf-lb-maglev-table-size: invalid value {size!r}, supported values are: "
                          f"{list(MAGLEV_TABLE_SIZES)}")
    seed = str(given.get("--bpf-lb-maglev-hash-seed", DEFAULT_MAGLEV_HASH_SEED))
    try:
        raw = base64.b64decode(seed, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ConfigError(f"--bpf-lb-maglev-hash-seed: cannot decode base64 Maglev hash seed "
                          f"{seed!r}: {err}") from err
    if len(raw) != 12:
        raise ConfigError(f"--bpf-lb-maglev-hash-seed: decoded hash seed is {len(raw)} bytes (not 12 "
                          "bytes); make one with: head -c12 /dev/urandom | base64 -w0")
    return {"bpf_lb_algorithm": algorithm, "bpf_lb_maglev_table_size": size,
            "bpf_lb_maglev_hash_seed": seed}


def _sync(given: Given, file: KubeProxyConfiguration, mode: str) -> SyncSettings:
    table = mode if mode in ("ipvs", "nftables") else "iptables"
    periods: list[tuple[float, str, str]] = []
    for flag, key, default in (("--min-sync-period", "minSyncPeriod", DEFAULT_MIN_SYNC_PERIOD_S),
                               ("--sync-period", "syncPeriod", DEFAULT_SYNC_PERIOD_S)):
        if flag in given:
            text = str(given[flag])
            periods.append((parse_period(text, name=flag), flag, text))
        elif file.source:
            text = file.document[table][key]
            name = _field(file, f"{table}.{key}")
            periods.append((parse_period(text, name=name), name, text))
        else:
            periods.append((default, flag, f"{default:g}s"))
    (min_s, min_from, min_text), (sync_s, sync_from, sync_text) = periods
    if sync_s <= 0 or min_s > sync_s:
        raise ConfigError(f"{sync_from} ({sync_text}) must be > 0 and >= {min_from} ({min_text})")
    return SyncSettings(min_sync_period_s=min_s, sync_period_s=sync_s)


def _userspace(given: Given, *, check: bool) -> UserspaceSettings:
    bind = given.get("--bind-address")
    address_map = given.get("--address-map")
    if check and address_map is not None:
        path = Path(str(address_map))
        if path.is_dir():
            raise ConfigError(f"--address-map: {str(address_map)!r} is a folder; give the path of a file "
                              "to write")
        folder = path.absolute().parent
        if not folder.is_dir():
            raise ConfigError(f"--address-map: folder {str(folder)!r} does not exist")
    udp = given.get("--udp-timeout")
    drain = given.get("--drain-timeout")
    caps = {flag[2:].replace("-", "_"): parse_count(str(given[flag]), name=flag)
            for flag in CAP_FLAGS if flag in given}
    return UserspaceSettings(
        **caps,
        bind_address=parse_specific_ip(str(bind), name="--bind-address") if bind is not None else None,
        loopback_block=parse_ipv4_cidr(str(given.get("--loopback-block", DEFAULT_LOOPBACK_BLOCK)),
                                       name="--loopback-block"),
        address_map=str(address_map) if address_map is not None else None,
        udp_timeout_s=(parse_period(str(udp), name="--udp-timeout", positive=True) if udp is not None
                       else DEFAULT_UDP_TIMEOUT_S),
        drain_timeout_s=(parse_period(str(drain), name="--drain-timeout") if drain is not None
                         else DEFAULT_DRAIN_TIMEOUT_S))


def _ingress(given: Given) -> IngressSettings:
    """``--ingress-bind-address IP:PORT`` (brackets around an IPv6 address) and ``--ingress-class``."""
    bind = given.get("--ingress-bind-address")
    address: tuple[str, int] | None = None
    if bind is not None and str(bind) != "":
        text = str(bind)
        host, sep, port_text = text.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        host = host[1:-1] if bracketed else host
        if ":" in host and not bracketed:
            sep = ""  # an IPv6 address needs brackets, else "::1:80" is ambiguous
        try:
            ip = str(ipaddress.ip_address(host))
            port = int(port_text) if port_text.isdigit() else -1
        except ValueError:
            ip, port = "", -1
        if not sep or not ip or not 0 <= port <= 65535:
            raise ConfigError("--ingress-bind-address: expected IP:PORT (e.g. 127.0.0.1:8080 or "
                              f"[::1]:8080), got {text!r}")
        address = (ip, port)
    klass = str(given.get("--ingress-class", DEFAULT_INGRESS_CLASS))
    if not klass:
        raise ConfigError("--ingress-class: an Ingress class name is required (default nginx)")
    return IngressSettings(bind_address=address, ingress_class=klass)


def _observability(given: Given, file: KubeProxyConfiguration) -> ObservabilitySettings:
    healthz, healthz_from = DEFAULT_HEALTHZ_BIND_ADDRESS, "--healthz-bind-address"
    if "--healthz-bind-address" in given:
        healthz = str(given["--healthz-bind-address"])
    elif file.written.get("healthzBindAddress"):
        healthz, healthz_from = file.healthz_bind_address, _field(file, "healthzBindAddress")
    metrics, metrics_from = DEFAULT_METRICS_BIND_ADDRESS, "--metrics-bind-address"
    if "--metrics-bind-address" in given:
        metrics = str(given["--metrics-bind-address"])
    elif file.source:
        metrics = file.metrics_bind_address
        if file.written.get("metricsBindAddress"):
            metrics_from = _field(file, "metricsBindAddress")
    checks = given.get("--healthcheck-bind-addresses")
    return ObservabilitySettings(
        healthz_bind_address=healthz, metrics_bind_address=metrics, healthz_from=healthz_from,
        metrics_from=metrics_from,
        healthcheck_bind_addresses=(parse_ip_list(str(checks), name="--healthcheck-bind-addresses")
                                    if checks is not None else DEFAULT_HEALTHCHECK_BIND_ADDRESSES))


def _source(given: Given, file: KubeProxyConfiguration) -> tuple[SourceSettings, tuple[str, ...]]:
    manifests = tuple(str(p) for p in given.get("--manifests") or ())
    if manifests.count(STDIN_PATH) > 1:
        raise ConfigError("--manifests: '-' (standard input) can be given once")
    kubeconfig = given.get("--kubeconfig")
    master = given.get("--master")
    notes: list[str] = []
    if manifests and (kubeconfig is not None or master is not None):
        raise ConfigError("--manifests cannot be combined with --kubeconfig or --master; choose one source")
    if kubeconfig is None and file.kubeconfig:
        if manifests:
            notes.append(f"{_field(file, 'clientConnection.kubeconfig')} is not used: --manifests given on "
                         "the command line wins over the file")
        else:
            kubeconfig = file.kubeconfig
    proxy_name = given.get("--service-proxy-name")
    settings = SourceSettings(manifests=manifests,
                              kubeconfig=str(kubeconfig) if kubeconfig is not None else None,
                              master=str(master) if master is not None else None,
                              service_proxy_name=str(proxy_name) if proxy_name is not None else None)
    return settings, tuple(notes)


def _ignored(given: Given, command: Command, mode: str) -> tuple[str, ...]:
    """``run``'s flags given that the chosen mode does not use (the others' are their own affair)."""
    if command is not Command.RUN:
        return ()
    if mode == "userspace":
        unused: tuple[str, ...] = KERNEL_ONLY_FLAGS + EBPF_ONLY_FLAGS
    else:
        unused = USERSPACE_ONLY_FLAGS + (IPVS_ONLY_FLAGS if mode != "ipvs" else ())
        if mode == "nftables":  # KEP-3866: the nftables proxier has no localhost NodePorts
            unused += ("--iptables-localhost-nodeports",)
        unused += EBPF_ONLY_FLAGS if mode != "ebpf" else ()
        unused += NFTABLES_ONLY_FLAGS if mode != "nftables" else ()
    return tuple(flag for flag in unused if flag in given)
