"""``kproxy render --proxy-mode ebpf``: the maps as a stable JSON document and as a table like
``cilium-dbg bpf lb list``.

The document (``schema: kproxy.ebpf/v1``; see the README):

- ``services``: one object per frontend: ``frontend`` (``addr:port/PROTO``, ``[addr]`` for IPv6),
  ``scope`` (``external``/``internal``), ``type``, ``service`` (``ns/name:port``),
  ``rev_nat_index``, ``count``, ``qcount``, ``flags`` (Cilium's ``ServiceFlags.String`` words),
  ``algorithm`` (``random``/``maglev``, what the datapath applies), ``algorithm_bits`` (the
  master's upper 8 bits: 0 default, 1 random, 2 maglev), ``affinity_timeout`` (seconds),
  ``slots`` (backend ids of slots 1..N), ``source_ranges``;
- ``backends``: ``id``, ``address`` (``addr:port/PROTO``), ``state`` (``active``,
  ``terminating``, ``quarantined``, ``maintenance``);
- ``reverse_nat``: ``rev_nat_index``, ``address`` (``addr:port``);
- ``affinity_match``: ``rev_nat_index``, ``backend_id``;
- ``maglev``: ``rev_nat_index``, ``table`` (M backend ids).
"""

from __future__ import annotations

from typing import Any

from kproxy.modes.ebpf.frontends import FrontendType
from kproxy.modes.ebpf.layout import (
    SOURCE_RANGE_DENY,
    LBAlgorithm,
    Scope,
    ServiceFlag,
    ServiceFlag2,
    protocol_name,
)
from kproxy.modes.ebpf.render import EbpfMaps, RenderedFrontend

__all__ = ["SCHEMA", "flag_words", "to_document", "to_table"]

#: The document's ``schema`` value.
SCHEMA = "kproxy.ebpf/v1"


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def flag_words(kind: FrontendType, flags: ServiceFlag, flags2: ServiceFlag2) -> list[str]:
    """A master entry's flags as Cilium's ``ServiceFlags.String`` words, in its order:
    the type, ``Local``, ``InternalLocal``, ``two-scopes``, ``sessionAffinity``,
    ``non-routable``, ``check source-range`` (and ``deny``)."""
    words = [kind.value]
    if flags & ServiceFlag.EXT_LOCAL_SCOPE:
        words.append("Local")
    if flags2 & ServiceFlag2.INT_LOCAL_SCOPE:
        words.append("InternalLocal")
    if flags2 & ServiceFlag2.TWO_SCOPES:
        words.append("two-scopes")
    if flags & ServiceFlag.AFFINITY:
        words.append("sessionAffinity")
    if not flags & ServiceFlag.ROUTABLE:
        words.append("non-routable")
    if flags & ServiceFlag.SOURCE_RANGE:
        words.append("check source-range")
        if flags2 & SOURCE_RANGE_DENY:
            words.append("deny")
    return words


def _frontend(fe: RenderedFrontend) -> str:
    p = fe.plan
    scope = "/i" if p.scope is Scope.INTERNAL else ""
    return f"{_host(p.address)}:{p.port}/{p.protocol}{scope}"


def to_document(maps: EbpfMaps) -> dict[str, Any]:
    """The stable JSON document of the maps (shapes in the module docstring)."""
    services: list[dict[str, Any]] = []
    reverse: list[dict[str, Any]] = []
    matches: list[dict[str, Any]] = []
    maglev: list[dict[str, Any]] = []
    for fe in maps.frontends:
        p = fe.plan
        services.append({
            "frontend": f"{_host(p.address)}:{p.port}/{p.protocol}",
            "scope": "internal" if p.scope is Scope.INTERNAL else "external",
            "type": p.type.value,
            "service": str(fe.name),
            "rev_nat_index": fe.rev_nat_index,
            "count": fe.master.count,
            "qcount": fe.master.qcount,
            "flags": flag_words(p.type, p.flags, p.flags2),
            "algorithm": "maglev" if p.effective_algorithm is LBAlgorithm.MAGLEV else "random",
            "algorithm_bits": int(fe.master.algorithm),
            "affinity_timeout": fe.master.affinity_timeout,
            "slots": list(fe.slots),
            "source_ranges": list(p.source_ranges),
        })
        reverse.append({"rev_nat_index": fe.rev_nat_index, "address": f"{_host(p.address)}:{p.port}"})
        matches.extend({"rev_nat_index": fe.rev_nat_index, "backend_id": b} for b in fe.affinity_match)
        if fe.maglev:
            maglev.append({"rev_nat_index": fe.rev_nat_index, "table": list(fe.maglev)})
    backends = [{"id": backend_id, "address": f"{_host(be.address)}:{be.port}/{protocol_name(be.proto)}",
                 "state": be.state.name.lower()} for backend_id, be in maps.backends]
    reverse.sort(key=lambda r: int(r["rev_nat_index"]))
    return {"schema": SCHEMA, "services": services, "backends": backends, "reverse_nat": reverse,
            "affinity_match": matches, "maglev": maglev}


def to_table(maps: EbpfMaps) -> str:
    """The services map as ``cilium-dbg bpf lb list`` prints it: one row per slot,
    ``SERVICE ADDRESS (slot)`` then ``BACKEND ADDRESS (REVNAT_ID) (SLOT)``; the master row shows
    ``0.0.0.0:0`` (``[::]:0``) and the flags."""
    backends = dict(maps.backends)
    rows: list[tuple[str, str]] = []
    for fe in maps.frontends:
        front = _frontend(fe)
        zero = "[::]:0" if ":" in fe.plan.address else "0.0.0.0:0"
        words = ", ".join(flag_words(fe.plan.type, fe.plan.flags, fe.plan.flags2))
        for slot, backend_id in enumerate(fe.slots, start=1):
            be = backends[backend_id]
            rows.append((f"{front} ({slot})",
                         f"{_host(be.address)}:{be.port}/{protocol_name(be.proto)} "
                         f"({fe.rev_nat_index}) ({slot})"))
        rows.append((f"{front} (0)", f"{zero} ({fe.rev_nat_index}) (0) [{words}]"))
    header = ("SERVICE ADDRESS", "BACKEND ADDRESS (REVNAT_ID) (SLOT)")
    width = max([len(header[0])] + [len(a) for a, _ in rows]) + 3
    return "".join(f"{a.ljust(width)}{b}\n" for a, b in [header, *rows])
