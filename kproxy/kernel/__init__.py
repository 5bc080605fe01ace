"""Where rendered state goes: an emulated node (default, rootless) or the real kernel (root).

- :class:`EmulatedKernel` programs an :class:`emulation.netfilter.Netns`;
  :class:`LinuxKernel` runs ``iptables-restore`` (and ``iptables -C/-I`` for the jump rules).
  Both satisfy :class:`IptablesApplier`.
- :mod:`kproxy.kernel.trace` follows one packet through an emulated node (``kproxy trace``).
"""

from kproxy.kernel.base import ENSURED_JUMPS, IptablesApplier
from kproxy.kernel.emulated import EmulatedKernel, ensure_jumps
from kproxy.kernel.linux import LinuxKernel
from kproxy.kernel.trace import TraceResult, format_trace, make_packet, trace_node, trace_packet

__all__ = [
    "ENSURED_JUMPS",
    "EmulatedKernel",
    "IptablesApplier",
    "LinuxKernel",
    "TraceResult",
    "ensure_jumps",
    "format_trace",
    "make_packet",
    "trace_node",
    "trace_packet",
]
