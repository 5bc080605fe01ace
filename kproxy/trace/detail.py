"""Per-endpoint detail of a trace, and where a packet arrives on a node with real interfaces.

Theory of operation: :func:`trace_detail` adds to ``kproxy trace --json`` what a reader needs
beside the merged path (issue 17), keeping the existing keys' meaning:

- ``"endpoints"``: each entry also carries its own ``"trace"`` (the rules met by the outcomes
  that reached it, in walking order, each once) and the ``"source"`` (``ip:port``) the endpoint
  sees after SNAT or masquerade;
- ``"snat"``: ``{"target": "MASQUERADE"|"SNAT", "address": ip}`` of the most probable accepted
  outcome whose source was translated, or ``None`` when no accepted outcome's source changed;
- ``"delivery"``: for a packet delivered to the node, ``"delivered to a local socket on PORT"``
  with the remark that whether something listens there is outside the rules (the kernel answers
  a TCP SYN to a closed port with a reset), else ``None``.

:func:`arrival_interface` decides the interface a packet from outside arrives on when the node's
real interfaces are known: the one given (``--in-interface``), else the out device of the route
back to its source (what reverse-path filtering would accept), else ``lo`` for a local address.
"""

from __future__ import annotations

from typing import Any

from emulation import Node
from emulation.addr import parse_address
from emulation.netfilter import Outcome
from kproxy.errors import ConfigError
from kproxy.trace.netfilter import TraceResult

__all__ = ["arrival_interface", "trace_detail"]


def _hp(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _path(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    seen: set[tuple[str, str, str, int, str]] = set()
    out = []
    for o in outcomes:
        for s in o.trace:
            key = (s.hook, s.table, s.chain, s.line, s.rule)
            if s.result == "nomatch" or key in seen:
                continue
            seen.add(key)
            out.append({"hook": s.hook, "table": s.table, "chain": s.chain, "rule": s.rule, "line": s.line,
                        "unknown": s.result == "unknown"})
    return out


def trace_detail(result: TraceResult) -> dict[str, Any]:
    """The keys of the module docstring for ``result``, to merge into its ``to_json()``."""
    accepted = [(p, o) for p, o in result.outcomes if o.verdict == "ACCEPT"]
    endpoints = []
    for e in result.endpoints:
        mine = [o for _, o in accepted if o.dnat and o.destination == e.address]
        sources = sorted({_hp(o.packet.src, o.packet.sport) for o in mine})
        endpoints.append({"address": e.address, "probability": e.probability, "trace": _path(mine),
                          "source": sources[0] if len(sources) == 1 else sources})
    snat = None
    for _, o in sorted(accepted, key=lambda po: -po[0]):
        if o.masquerade or o.snat:
            snat = {"target": "MASQUERADE" if o.masquerade else "SNAT", "address": o.packet.src}
            break
    delivery = None
    local = [o for _, o in accepted if o.delivery == "local"]
    if local:
        ports = sorted({o.packet.dport for o in local})
        delivery = (f"delivered to a local socket on {', '.join(map(str, ports))}; whether something "
                    "listens there is outside the rules (a closed TCP port answers with a reset)")
    return {"endpoints": endpoints, "snat": snat, "delivery": delivery}


def arrival_interface(node: Node, src: str, given: str | None) -> str | None:
    """The interface a packet from ``src`` arrives on (module docstring); ``None`` means the node
    itself sends it (a local source, without ``--in-interface``).

    Raises:
        ConfigError: ``given`` is not one of the node's interfaces, or no route leads back to ``src``.
    """
    if given is not None:
        if node.interface(given) is None:
            names = ", ".join(i.name for i in node.interfaces)
            raise ConfigError(f"--in-interface {given}: the node has no such interface (it has {names})")
        return given
    version, value = parse_address(src)
    if node.is_local(version, value):
        return None
    route = node.route(version, value)
    if route.kind != "unicast" or route.device is None:
        raise ConfigError(f"--src {src}: the node has no route back to it ({route.kind}), so the interface "
                          "it arrives on is unknown; give --in-interface IF")
    return route.device
