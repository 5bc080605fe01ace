"""Kernel models for kproxy: standalone, they never import ``kproxy``.

Their input is the kernel's own formats (``iptables-save`` text ...) and a packet; their output
is what the kernel would do, with a trace.
"""

from emulation.clock import Clock, ManualClock
from emulation.conntrack import ConntrackEntry, ConntrackTable
from emulation.errors import EmulationError, NetfilterError
from emulation.node import Interface, Node, Route
from emulation.packet import Packet

__all__ = [
    "Clock",
    "ConntrackEntry",
    "ConntrackTable",
    "EmulationError",
    "Interface",
    "ManualClock",
    "NetfilterError",
    "Node",
    "Packet",
    "Route",
]
