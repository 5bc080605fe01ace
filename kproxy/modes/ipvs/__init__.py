"""kube-proxy's ipvs mode: a pure renderer from a Snapshot to IPVS state, ipsets and iptables rules.

- :func:`render` (and :func:`render_state`) compute what kube-proxy's ipvs proxier
  (``pkg/proxy/ipvs/proxier.go``) programs for one IP family: the ``kube-ipvs0`` addresses,
  the virtual and real servers (:class:`IpvsState`), its ipsets and its iptables-restore input.
- :data:`JUMP_RULES` are the jumps it ensures into its chains outside the restore.
- :class:`GracefulTermination` is ``graceful_termination.go``; :class:`IpvsMode` (in
  :mod:`kproxy.modes.ipvs.mode`) applies renders to an emulated node.
"""

from kproxy.modes.ipvs.config import DEFAULT_SCHEDULER, IpvsConfig
from kproxy.modes.ipvs.graceful import CHECK_INTERVAL_S, GracefulTermination, termination_needed
from kproxy.modes.ipvs.names import CHAINS, JUMP_RULES, SET_SPECS, SetSpec, set_name
from kproxy.modes.ipvs.render import render_state
from kproxy.modes.ipvs.rules import render_rules
from kproxy.modes.ipvs.state import (
    FLAG_PERSISTENT,
    FLAG_SOURCE_HASH,
    IpsetEntries,
    IpvsState,
    RealServer,
    VirtualServer,
)
from kproxy.modes.ipvs.text import (
    IpvsRender,
    build_table,
    dest_spec_of,
    format_ipset_restore,
    format_ipvsadm_save,
    render,
    spec_of,
)

__all__ = [
    "CHAINS",
    "CHECK_INTERVAL_S",
    "DEFAULT_SCHEDULER",
    "FLAG_PERSISTENT",
    "FLAG_SOURCE_HASH",
    "JUMP_RULES",
    "SET_SPECS",
    "GracefulTermination",
    "IpsetEntries",
    "IpvsConfig",
    "IpvsRender",
    "IpvsState",
    "RealServer",
    "SetSpec",
    "VirtualServer",
    "build_table",
    "dest_spec_of",
    "format_ipset_restore",
    "format_ipvsadm_save",
    "render",
    "render_rules",
    "render_state",
    "set_name",
    "spec_of",
    "termination_needed",
]
