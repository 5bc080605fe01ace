"""The maps of the ebpf mode as Cilium creates them: names, types, key and value sizes, flags
and default sizes (``pkg/maps/lbmap``; ``--bpf-lb-map-max``)."""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.errors import InvalidArgument
from kproxy.model import IPFamily
from kproxy.modes.ebpf.wire import BPF_F_NO_PREALLOC, DEFAULT_LB_MAP_MAX, DEFAULT_SOCK_REV_NAT_MAX, MapType

__all__ = ["MAP_SPECS", "MapSpec", "map_spec", "map_specs"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MapSpec:
    """One map as Cilium creates it.

    Attributes:
        name: the map's name (its pin name under ``/sys/fs/bpf/tc/globals``).
        type: the BPF map type.
        key_size, value_size: in bytes (``value_size`` of the Maglev outer map is the inner
            map's fd, 4 bytes).
        max_entries: Cilium's default size.
        flags: ``map_flags`` (``BPF_F_NO_PREALLOC`` where Cilium sets it by default).
        inner: the inner map's spec, for a map of maps.
    """

    name: str
    type: MapType
    key_size: int
    value_size: int
    max_entries: int
    flags: int = 0
    inner: MapSpec | None = None

    @property
    def kernel_name(self) -> str:
        """The name the kernel keeps: ``BPF_OBJ_NAME_LEN`` is 16 with the NUL, so cilium/ebpf
        truncates to 15 characters."""
        return self.name[:15]


def _maglev_inner(table_size: int) -> MapSpec:
    return MapSpec(name="cilium_maglev_inner", type=MapType.ARRAY, key_size=4,
                   value_size=4 * table_size, max_entries=1)


def _family_specs(v: str, v6: bool, table_size: int) -> tuple[MapSpec, ...]:
    wide = 12 if v6 else 0
    n = DEFAULT_LB_MAP_MAX
    return (
        MapSpec(name=f"cilium_lb{v}_services_v2", type=MapType.HASH, key_size=12 + wide,
                value_size=12, max_entries=n, flags=BPF_F_NO_PREALLOC),
        MapSpec(name=f"cilium_lb{v}_backends_v3", type=MapType.HASH, key_size=4,
                value_size=12 + wide, max_entries=n, flags=BPF_F_NO_PREALLOC),
        MapSpec(name=f"cilium_lb{v}_reverse_nat", type=MapType.HASH, key_size=2,
                value_size=6 + wide, max_entries=n, flags=BPF_F_NO_PREALLOC),
        MapSpec(name=f"cilium_lb{v}_affinity", type=MapType.LRU_HASH, key_size=16 + (8 if v6 else 0),
                value_size=16, max_entries=n),
        MapSpec(name=f"cilium_lb{v}_source_range", type=MapType.LPM_TRIE, key_size=12 + wide,
                value_size=1, max_entries=n, flags=BPF_F_NO_PREALLOC),
        MapSpec(name=f"cilium_lb{v}_maglev", type=MapType.HASH_OF_MAPS, key_size=2, value_size=4,
                max_entries=n, flags=BPF_F_NO_PREALLOC, inner=_maglev_inner(table_size)),
        MapSpec(name=f"cilium_lb{v}_reverse_sk", type=MapType.LRU_HASH, key_size=16 + wide,
                value_size=8 + wide, max_entries=DEFAULT_SOCK_REV_NAT_MAX),
    )


def map_specs(table_size: int = 16381) -> dict[str, MapSpec]:
    """Every map of the eBPF mode, by name, for a Maglev table of ``table_size`` entries.

    The IPv4 and IPv6 twins of the services, backends, reverse-NAT, affinity, source-range,
    Maglev and socket reverse-NAT maps (``lb.h``), and the shared ``cilium_lb_affinity_match``.
    """
    specs = _family_specs("4", False, table_size) + _family_specs("6", True, table_size) + (
        MapSpec(name="cilium_lb_affinity_match", type=MapType.HASH, key_size=8, value_size=1,
                max_entries=DEFAULT_LB_MAP_MAX, flags=BPF_F_NO_PREALLOC),
    )
    return {spec.name: spec for spec in specs}


#: The maps with the default Maglev table size (16381).
MAP_SPECS: dict[str, MapSpec] = map_specs()


def map_spec(kind: str, family: IPFamily, table_size: int = 16381) -> MapSpec:
    """The spec of one map: ``kind`` is ``services_v2``, ``backends_v3``, ``reverse_nat``,
    ``affinity``, ``source_range``, ``maglev``, ``reverse_sk`` or ``affinity_match``.

    Raises:
        InvalidArgument: an unknown kind.
    """
    name = ("cilium_lb_affinity_match" if kind == "affinity_match" else
            f"cilium_lb{'6' if family is IPFamily.IPv6 else '4'}_{kind}")
    specs = MAP_SPECS if table_size == 16381 else map_specs(table_size)
    try:
        return specs[name]
    except KeyError:
        raise InvalidArgument(f"no eBPF map kind {kind!r}") from None
