"""KubeProxyConfiguration (``kubeproxy.config.k8s.io/v1alpha1``): strict reading, kube-proxy's defaults.

kube-proxy reads ``--config FILE`` strictly (an unknown or duplicated field is an error) and then
applies ``SetDefaults_KubeProxyConfiguration`` (``pkg/proxy/apis/config/v1alpha1/defaults.go``):
a field left at its zero value takes its default. That includes ``iptables.minSyncPeriod: 0s``,
which becomes 1 s, exactly as in kube-proxy (only the command-line flag can set 0). The health and
metrics addresses default from ``bindAddress``'s family (``0.0.0.0:10256`` / ``127.0.0.1:10249``,
or ``[::]:10256`` / ``[::1]:10249``) and get their port appended when it is missing.

Validation follows ``pkg/proxy/apis/config/validation``: positive sync periods with
``minSyncPeriod <= syncPeriod``, ``masqueradeBit`` in 0..31, ``oomScoreAdj`` in -1000..1000, a
known ``mode``, IP addresses where addresses are expected, CIDRs or ``primary`` alone in
``nodePortAddresses`` (a bare IP is refused, as kube-proxy refuses it). Every error is a
:class:`~kproxy.errors.ConfigError` naming the file and the field's JSON path.

Pure apart from :func:`load_configuration`, which reads the file.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from kproxy.config.durations import parse_duration
from kproxy.config.goparse import CsvError, parse_cidr_sloppy, parse_ip_sloppy, read_csv_record
from kproxy.errors import ConfigError

__all__ = [
    "API_VERSION",
    "KIND",
    "MODES",
    "NODEPORT_ADDRESSES_PRIMARY",
    "KubeProxyConfiguration",
    "check_nodeport_addresses",
    "default_configuration",
    "dump_configuration",
    "load_configuration",
    "nodeport_addresses_flag",
    "parse_configuration",
]

API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
KIND = "KubeProxyConfiguration"
#: kube-proxy's modes (``""`` = the platform default) and kproxy's own ``userspace`` and ``ebpf``.
MODES = ("", "iptables", "ipvs", "nftables", "kernelspace", "userspace", "ebpf")
#: The ``nodePortAddresses`` value meaning "the node's primary IP of each family".
NODEPORT_ADDRESSES_PRIMARY = "primary"

_Leaf = tuple[str, Any]  # (type, default); default None means "no default" (zero value kept)

_SCHEMA: dict[str, Any] = {
    "apiVersion": ("str", API_VERSION),
    "kind": ("str", KIND),
    "featureGates": ("map_bool", {}),
    "clientConnection": {
        "kubeconfig": ("str", ""), "acceptContentTypes": ("str", ""),
        "contentType": ("str", "application/vnd.kubernetes.protobuf"), "qps": ("float", 5.0),
        "burst": ("int", 10)},
    "logging": ("any", {}),
    "hostnameOverride": ("str", ""),
    "bindAddress": ("str", "0.0.0.0"),
    "healthzBindAddress": ("str", ""),
    "metricsBindAddress": ("str", ""),
    "bindAddressHardFail": ("bool", False),
    "enableProfiling": ("bool", False),
    "showHiddenMetricsForVersion": ("str", ""),
    "mode": ("str", ""),
    "iptables": {
        "masqueradeBit": ("int", 14), "masqueradeAll": ("bool", False), "localhostNodePorts": ("bool", True),
        "snatNodeInternalIP": ("bool", False), "syncPeriod": ("duration", "30s"),
        "minSyncPeriod": ("duration", "1s")},
    "ipvs": {
        "syncPeriod": ("duration", "30s"), "minSyncPeriod": ("duration", "0s"), "scheduler": ("str", ""),
        "excludeCIDRs": ("list", []), "strictARP": ("bool", False), "tcpTimeout": ("duration", "0s"),
        "tcpFinTimeout": ("duration", "0s"), "udpTimeout": ("duration", "0s")},
    "nftables": {
        "masqueradeBit": ("int", 14), "masqueradeAll": ("bool", False), "syncPeriod": ("duration", "30s"),
        "minSyncPeriod": ("duration", "1s")},
    "winkernel": {
        "networkName": ("str", ""), "sourceVip": ("str", ""), "enableDSR": ("bool", False),
        "rootHnsEndpointName": ("str", ""), "forwardHealthCheckVip": ("bool", False)},
    "detectLocalMode": ("str", ""),
    "detectLocal": {"bridgeInterface": ("str", ""), "interfaceNamePrefix": ("str", "")},
    "clusterCIDR": ("str", ""),
    "nodePortAddresses": ("list", []),
    "oomScoreAdj": ("int", -999),
    "conntrack": {
        "maxPerCore": ("int", 32 * 1024), "min": ("int", 128 * 1024),
        "tcpEstablishedTimeout": ("duration", "24h0m0s"), "tcpCloseWaitTimeout": ("duration", "1h0m0s"),
        "tcpBeLiberal": ("bool", False), "udpTimeout": ("duration", "0s"),
        "udpStreamTimeout": ("duration", "0s")},
    "configSyncPeriod": ("duration", "15m0s"),
    "portRange": ("str", ""),
    "windowsRunAsService": ("bool", False),
}

#: Fields whose zero value is replaced by the default, as SetDefaults does (``if x == 0``).
_ZERO_DEFAULTED = frozenset({
    "iptables.syncPeriod", "iptables.minSyncPeriod", "ipvs.syncPeriod", "nftables.syncPeriod",
    "nftables.minSyncPeriod", "configSyncPeriod", "clientConnection.qps", "clientConnection.burst",
    "clientConnection.contentType", "bindAddress"})


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeProxyConfiguration:
    """A defaulted, validated KubeProxyConfiguration, with the fields kproxy uses lifted out.

    Attributes:
        document: the whole configuration with defaults applied (read-only nested mappings).
        source: the file it came from, or ``""``.
        hostname_override, bind_address, healthz_bind_address, metrics_bind_address, mode,
        cluster_cidr, kubeconfig: as in the document.
        node_port_addresses: ``nodePortAddresses``.
        sync_period_s, min_sync_period_s: the sync periods of ``mode`` (``iptables`` for ``""``
            and ``userspace``), in seconds.
        config_sync_period_s: ``configSyncPeriod`` in seconds.
        written: the document as written, before defaults (read-only): what the file set.
    """

    document: Mapping[str, Any]
    source: str = ""
    written: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    hostname_override: str = ""
    bind_address: str = "0.0.0.0"
    healthz_bind_address: str = "0.0.0.0:10256"
    metrics_bind_address: str = "127.0.0.1:10249"
    mode: str = ""
    cluster_cidr: str = ""
    kubeconfig: str = ""
    node_port_addresses: tuple[str, ...] = ()
    sync_period_s: float = 30.0
    min_sync_period_s: float = 1.0
    config_sync_period_s: float = 900.0

    def get(self, path: str) -> Any:
        """The value at a dotted JSON path (``iptables.masqueradeBit``).

        Raises:
            ConfigError: no such field.
        """
        node: Any = self.document
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise ConfigError(f"KubeProxyConfiguration has no field {path!r}")
            node = node[part]
        return node


def _err(source: str, path: str, problem: str) -> ConfigError:
    where = f"{source}: " if source else ""
    return ConfigError(f"{where}{path}: {problem}")


def _leaf(kind: str, value: Any, path: str, source: str) -> Any:
    expected: dict[str, type] = {"str": str, "bool": bool, "list": list, "map_bool": dict}
    if kind in expected:
        if not isinstance(value, expected[kind]):
            raise _err(source, path, f"expected a {kind.replace('map_bool', 'map of booleans')}, "
                                     f"got {type(value).__name__} {value!r}")
        items: Any = value
        if kind == "list" and not all(isinstance(v, str) for v in items):
            raise _err(source, path, f"expected a list of strings, got {value!r}")
        if kind == "map_bool" and not all(isinstance(v, bool) for v in items.values()):
            raise _err(source, path, f"expected a map of feature names to booleans, got {value!r}")
        return copy.deepcopy(value)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _err(source, path, f"expected an integer, got {type(value).__name__} {value!r}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _err(source, path, f"expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if kind == "duration":
        if not isinstance(value, str):
            raise _err(source, path, f"expected a duration such as '30s' or '1m', got {value!r}")
        try:
            parse_duration(value, flag=path)
        except ConfigError as err:  # its message already starts with the path: add only the file
            raise ConfigError(f"{source}: {err}" if source else str(err)) from None
        return value
    return copy.deepcopy(value)  # "any"


def _walk(schema: Mapping[str, Any], given: Any, prefix: str, source: str) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        raise _err(source, prefix or "document", f"expected a mapping, got {type(given).__name__} {given!r}")
    unknown = sorted(set(given) - set(schema))
    if unknown:
        path = f"{prefix}.{unknown[0]}" if prefix else str(unknown[0])
        raise _err(source, path, f"unknown field; known fields here: {', '.join(sorted(schema))}")
    out: dict[str, Any] = {}
    for name, spec in schema.items():
        path = f"{prefix}.{name}" if prefix else name
        value = given.get(name)
        if isinstance(spec, dict):
            out[name] = _walk(spec, {} if value is None else value, path, source)
            continue
        kind, default = spec
        zero = path in _ZERO_DEFAULTED and (value in ("", 0, 0.0) or (kind == "duration" and _is_zero(value)))
        if value is None or zero:
            out[name] = copy.deepcopy(default)
        else:
            out[name] = _leaf(kind, value, path, source)
    return out


def _is_zero(value: Any) -> bool:
    try:
        return isinstance(value, str) and parse_duration(value) == 0
    except ConfigError:
        return False


def _append_port(address: str, port: int) -> str:
    if address.startswith("[") and "]:" in address:
        return address
    if address.count(":") == 1:
        return address
    if ":" in address:  # a bare IPv6 address
        return f"[{address}]:{port}"
    return f"{address}:{port}"


def _validate_ip(value: str, path: str, source: str) -> None:
    host = value
    if value.startswith("["):
        host = value[1:value.find("]")]
    elif value.count(":") == 1:
        host = value.partition(":")[0]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise _err(source, path, f"expected an IP address (with an optional port), got {value!r}") from None


def check_nodeport_addresses(values: Sequence[str], *, name: str) -> tuple[str, ...]:
    """kube-proxy's rule for ``nodePortAddresses`` / ``--nodeport-addresses``: CIDRs, or ``primary`` alone.

    As ``validateKubeProxyNodePortAddress`` (``pkg/proxy/apis/config/validation``): each value,
    taken exactly as given (no blanks stripped, no empty value dropped), is ``primary`` as the
    only value, or a CIDR that ``netutils.ParseCIDRSloppy`` reads (host bits may be set, IPv4
    octets may have leading zeros; no IPv6 zone). A bare address is refused, not taken as ``/32``.

    Args:
        values: the values, already split (see :func:`nodeport_addresses_flag` for the flag).
        name: what an error names: the flag, or the file and field.

    Returns:
        The values, each CIDR spelled canonically (``010.0.0.0/8`` becomes ``10.0.0.0/8``; host
        bits are kept).

    Raises:
        ConfigError: a value that is not such a CIDR (the message gives its position and the
            likely fix), or ``primary`` together with other values.
    """
    out = []
    for position, value in enumerate(values, start=1):
        if value == NODEPORT_ADDRESSES_PRIMARY:
            if len(values) != 1:
                raise ConfigError(f"{name}: {NODEPORT_ADDRESSES_PRIMARY!r} cannot be combined with CIDRs, "
                                  f"got {','.join(values)!r}; give either CIDRs or \"primary\" alone")
            return (NODEPORT_ADDRESSES_PRIMARY,)
        parsed = parse_cidr_sloppy(value) if isinstance(value, str) else None
        if parsed is None:
            where = f" at position {position}" if len(values) > 1 else ""
            raise ConfigError(f"{name}: expected CIDRs such as 192.168.0.0/24, or \"primary\"; "
                              f"got {value!r}{where}{_cidr_problem(value)}")
        out.append(f"{parsed[0]}/{parsed[1]}")
    return tuple(out)


def nodeport_addresses_flag(text: str, *, name: str = "--nodeport-addresses") -> tuple[str, ...]:
    """``--nodeport-addresses TEXT`` as kube-proxy reads it: one CSV record, then validated.

    pflag's ``StringSliceVar`` splits the value with ``encoding/csv``: at commas only, keeping
    blanks and empty elements (``"10.0.0.0/8,"`` has an empty second element, which is not a
    CIDR); ``""`` is the empty list (every local address).

    Raises:
        ConfigError: malformed CSV, or a value :func:`check_nodeport_addresses` refuses.
    """
    try:
        values = read_csv_record(text)
    except CsvError as err:
        raise ConfigError(f"{name}: {text!r} is not a comma-separated list: {err}") from None
    return check_nodeport_addresses(values, name=name)


def _cidr_problem(value: object) -> str:
    """A hint on why ``value`` is not a CIDR kube-proxy takes (maybe ``""``)."""
    if not isinstance(value, str):
        return " (expected a string)"
    if value == "":
        return " (an empty element: remove the trailing or doubled comma)"
    if value != value.strip():
        return (" (kube-proxy splits at commas only and keeps blanks: write the list without spaces, "
                "such as 10.0.0.0/8,192.168.0.0/16)")
    address, slash, prefix = value.partition("/")
    if "%" in address:
        return " (an IPv6 zone such as %eth0 is not allowed in a CIDR)"
    if not slash:
        ip = parse_ip_sloppy(address)
        if ip is None:
            return ""
        return f" (a bare address is not a CIDR: write {ip}/{ip.max_prefixlen} for this one address)"
    if not prefix.isdigit():  # Go's ParseCIDR takes a prefix length, not a netmask
        return " (the prefix must be a length such as /24)"
    return ""


def parse_configuration(raw: Any, *, source: str = "") -> KubeProxyConfiguration:
    """Validate a decoded KubeProxyConfiguration document and apply kube-proxy's defaults.

    Raises:
        ConfigError: wrong ``apiVersion``/``kind``, an unknown field, a value of the wrong type or
            out of range; the message names ``source`` and the field's path.
    """
    if isinstance(raw, Mapping):
        if raw.get("kind") != KIND:
            raise _err(source, "kind", f"expected {KIND!r}, got {raw.get('kind')!r}")
        if raw.get("apiVersion") != API_VERSION:
            raise _err(source, "apiVersion", f"expected {API_VERSION!r}, got {raw.get('apiVersion')!r}")
    doc = _walk(_SCHEMA, raw, "", source)
    _validate_ip(doc["bindAddress"], "bindAddress", source)
    v6 = ipaddress.ip_address(doc["bindAddress"].strip("[]")).version == 6
    for name, port, v4_default, v6_default in (("healthzBindAddress", 10256, "0.0.0.0", "[::]"),
                                               ("metricsBindAddress", 10249, "127.0.0.1", "[::1]")):
        doc[name] = (f"{v6_default if v6 else v4_default}:{port}" if not doc[name]
                     else _append_port(doc[name], port))
        _validate_ip(doc[name], name, source)
    if doc["mode"] not in MODES:
        raise _err(source, "mode", f"unknown proxy mode {doc['mode']!r}; expected one of {list(MODES)[1:]}")
    for table in ("iptables", "nftables"):
        if not 0 <= doc[table]["masqueradeBit"] <= 31:
            raise _err(source, f"{table}.masqueradeBit",
                       f"must be in 0..31, got {doc[table]['masqueradeBit']}")
    if not -1000 <= doc["oomScoreAdj"] <= 1000:
        raise _err(source, "oomScoreAdj", f"must be in -1000..1000, got {doc['oomScoreAdj']}")
    for path in ("conntrack.maxPerCore", "conntrack.min"):
        group, field = path.split(".")
        if doc[group][field] < 0:
            raise _err(source, path, f"must be >= 0, got {doc[group][field]}")
    doc["nodePortAddresses"] = list(check_nodeport_addresses(
        doc["nodePortAddresses"], name=f"{source}: nodePortAddresses" if source else "nodePortAddresses"))
    mode_table = {"ipvs": "ipvs", "nftables": "nftables"}.get(doc["mode"], "iptables")
    sync_s = parse_duration(doc[mode_table]["syncPeriod"])
    min_s = parse_duration(doc[mode_table]["minSyncPeriod"])
    if min_s > sync_s:
        raise _err(source, f"{mode_table}.minSyncPeriod",
                   f"({doc[mode_table]['minSyncPeriod']}) must be <= {mode_table}.syncPeriod "
                   f"({doc[mode_table]['syncPeriod']})")
    return KubeProxyConfiguration(
        document=_freeze(doc), source=source, hostname_override=doc["hostnameOverride"],
        bind_address=doc["bindAddress"], healthz_bind_address=doc["healthzBindAddress"],
        metrics_bind_address=doc["metricsBindAddress"], mode=doc["mode"], cluster_cidr=doc["clusterCIDR"],
        kubeconfig=doc["clientConnection"]["kubeconfig"], node_port_addresses=tuple(doc["nodePortAddresses"]),
        sync_period_s=sync_s, min_sync_period_s=min_s,
        config_sync_period_s=parse_duration(doc["configSyncPeriod"]),
        written=_freeze(copy.deepcopy(dict(raw))))


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value


def default_configuration() -> KubeProxyConfiguration:
    """kube-proxy's defaults, as an empty configuration file gives them."""
    return parse_configuration({"apiVersion": API_VERSION, "kind": KIND})


def dump_configuration(config: KubeProxyConfiguration) -> str:
    """The whole defaulted configuration as YAML (it reads back to an equal configuration)."""
    return yaml.safe_dump(_thaw(config.document), sort_keys=False)


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys, as kube-proxy's strict decoding does."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate field {key!r}",
                                                    key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def load_configuration(path: str | os.PathLike[str]) -> KubeProxyConfiguration:
    """Read ``--config FILE`` (YAML or JSON).

    Raises:
        ConfigError: the file cannot be read or parsed, or the configuration is invalid (the
            message names the file and the field).
    """
    where = os.fspath(path)
    try:
        text = Path(where).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--config {where}: cannot read: {err}") from err
    try:
        raw = json.loads(text) if where.endswith(".json") else yaml.load(text, Loader=_StrictLoader)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        detail = " ".join(str(err).split())
        raise ConfigError(f"--config {where}: not valid YAML/JSON: {detail}") from err
    return parse_configuration(raw, source=f"--config {where}")
