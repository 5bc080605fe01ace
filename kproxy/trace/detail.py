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

from collections.abc import Mapping, Sequence
from typing import Any

from emulation import Node
from emulation.addr import parse_address
from emulation.netfilter import Outcome
from kproxy.errors import ConfigError

__all__ = ["arrival_interface", "trace_detail"]


def _hp(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _path(outcomes: list[Outcome], shown: Mapping[tuple[str, str, str, str], tuple[int, bool]]
          ) -> list[dict[str, Any]]:
    seen: set[tuple[str, str, str, int, str]] = set()
    out = []
    for o in outcomes:
        for s in o.trace:
            key = (s.hook, s.table, s.chain, s.line, s.rule)
            if s.result == "nomatch" or key in seen:
                continue
            seen.add(key)
            line, unknown = shown.get((s.hook, s.table, s.chain, s.rule), (s.line, s.result == "unknown"))
            out.append({"hook": s.hook, "table": s.table, "chain": s.chain, "rule": s.rule, "line": line,
                        "unknown": unknown})
    return out


def trace_detail(outcomes: Sequence[tuple[float, Outcome]], endpoints: Sequence[tuple[str, float]],
                 shown: Mapping[tuple[str, str, str, str], tuple[int, bool]]) -> dict[str, Any]:
    """The keys of the module docstring, to merge into a trace's JSON.

    Args:
        outcomes: every ``(probability, Outcome)`` of the trace.
        endpoints: the trace's ``(address, probability)`` endpoints, in order.
        shown: ``(hook, table, chain, rule) -> (line, unknown)`` as the merged trace reports them
            (lines of built-in chains zeroed, unknown targets marked), so both paths agree.
    """
    accepted = [(p, o) for p, o in outcomes if o.verdict == "ACCEPT"]
    listed = []
    for address, probability in endpoints:
        mine = [o for _, o in accepted if o.dnat and o.destination == address]
        sources = sorted({_hp(o.packet.src, o.packet.sport) for o in mine})
        listed.append({"address": address, "probability": probability, "trace": _path(mine, shown),
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
    return {"endpoints": listed, "snat": snat, "delivery": delivery}


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
