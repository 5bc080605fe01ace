"""The eBPF mode: Cilium's service load balancing (``bpf/lib/lb.h``, ``pkg/loadbalancer``).

- :mod:`kproxy.modes.ebpf.layout`: the exact bytes of Cilium's map keys and values, IPv4 and
  IPv6, and the maps as Cilium creates them (:data:`MAP_SPECS`).
- :mod:`kproxy.modes.ebpf.maglev`: Maglev tables as Cilium's ``pkg/maglev``.
- :mod:`kproxy.modes.ebpf.config`: the node addresses and Cilium's load-balancing flags.
- :mod:`kproxy.modes.ebpf.frontends`: the frontends, flags and backends of a service port.
- :mod:`kproxy.modes.ebpf.render`: the map contents with Cilium's agent layout rules, stable
  ids, and the partial-sync diff (:class:`MapState`).
- :mod:`kproxy.modes.ebpf.document`: ``kproxy render --proxy-mode ebpf`` (table and JSON).
"""

from kproxy.modes.ebpf.config import EbpfConfig
from kproxy.modes.ebpf.document import to_document, to_table
from kproxy.modes.ebpf.frontends import FrontendPlan, FrontendType, plan_frontends
from kproxy.modes.ebpf.layout import (
    AFFINITY_TIMEOUT_MASK,
    BPF_F_NO_PREALLOC,
    DEFAULT_LB_MAP_MAX,
    IPPROTO,
    LB_ALGORITHM_SHIFT,
    MAP_SPECS,
    SOURCE_RANGE_DENY,
    AffinityKey,
    AffinityMatchKey,
    AffinityValue,
    Backend,
    BackendState,
    LBAlgorithm,
    MaglevOuterKey,
    MapSpec,
    MapType,
    ReverseNat,
    ReverseNatKey,
    Scope,
    ServiceFlag,
    ServiceFlag2,
    ServiceKey,
    ServiceValue,
    SockRevNatEntry,
    SockRevNatKey,
    SourceRangeKey,
    backend_key,
    maglev_inner_pack,
    maglev_inner_unpack,
    map_spec,
    map_specs,
    unpack_backend_key,
)
from kproxy.modes.ebpf.maglev import MaglevConfig, lookup_table
from kproxy.modes.ebpf.render import EbpfMaps, MapOp, MapState, OpKind, RenderedFrontend
from kproxy.modes.ebpf.render import render as render_maps

__all__ = [
    "AFFINITY_TIMEOUT_MASK",
    "BPF_F_NO_PREALLOC",
    "DEFAULT_LB_MAP_MAX",
    "IPPROTO",
    "LB_ALGORITHM_SHIFT",
    "MAP_SPECS",
    "SOURCE_RANGE_DENY",
    "AffinityKey",
    "AffinityMatchKey",
    "AffinityValue",
    "Backend",
    "BackendState",
    "EbpfConfig",
    "EbpfMaps",
    "FrontendPlan",
    "FrontendType",
    "LBAlgorithm",
    "MaglevConfig",
    "MaglevOuterKey",
    "MapOp",
    "MapSpec",
    "MapState",
    "MapType",
    "OpKind",
    "RenderedFrontend",
    "ReverseNat",
    "ReverseNatKey",
    "Scope",
    "ServiceFlag",
    "ServiceFlag2",
    "ServiceKey",
    "ServiceValue",
    "SockRevNatEntry",
    "SockRevNatKey",
    "SourceRangeKey",
    "backend_key",
    "lookup_table",
    "maglev_inner_pack",
    "maglev_inner_unpack",
    "map_spec",
    "map_specs",
    "plan_frontends",
    "render_maps",
    "to_document",
    "to_table",
    "unpack_backend_key",
]
