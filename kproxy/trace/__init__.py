"""Where a packet goes and why, through any mode's emulated node or a node's own dumps.

- :mod:`kproxy.trace.netfilter`: the trace result, its text and JSON forms, and the walk of a
  packet through an emulated netfilter node (:func:`trace_packet`);
- :mod:`kproxy.trace.ipvs`: the same through an IPVS node, from a render or from dumps;
- :mod:`kproxy.trace.nftables`: the same through nftables, from a render or a node's
  ``nft list ruleset``, with set and map lookups, numgen branches and step probabilities.

``kproxy trace``, ``kproxy verify`` and :mod:`kproxy.testing` all trace through here.
"""

from kproxy.trace.netfilter import (
    TraceEndpoint,
    TraceLine,
    TraceResult,
    find_chain_loop,
    format_trace,
    make_packet,
    parse_host_port,
    trace_packet,
)

__all__ = [
    "TraceEndpoint",
    "TraceLine",
    "TraceResult",
    "find_chain_loop",
    "format_trace",
    "make_packet",
    "parse_host_port",
    "trace_packet",
]
