"""kube-proxy's iptables mode: a pure renderer from a Snapshot to ``iptables-restore`` input.

- :func:`render_full` writes what kube-proxy's iptables proxier writes on a full sync;
  :func:`render_partial` what it writes on a partial one (KEP-3453); :class:`IptablesRenderer`
  keeps the state between syncs (full at start and after a failure, partial otherwise).
- :data:`JUMP_RULES` (and :data:`KUBELET_JUMP_RULES`) are the rules kube-proxy installs into
  the built-in chains, outside the restore.
- :func:`sort_restore_text` orders restore text as kube-proxy's tests compare it.

The text is kube-proxy's byte for byte, except that ports are walked sorted by
ServicePortName rather than in Go's random map order.
"""

from kproxy.modes.iptables.canonical import sort_restore_text
from kproxy.modes.iptables.config import NODEPORT_ADDRESSES_PRIMARY, IptablesConfig
from kproxy.modes.iptables.mode import (
    FULL_SYNC_PERIOD_S,
    IptablesMode,
    SyncRecord,
    ensure_jumps,
    load_now,
    program,
)
from kproxy.modes.iptables.names import (
    compute_probability,
    endpoint_chain_name,
    external_chain_name,
    firewall_chain_name,
    is_service_chain_name,
    local_policy_chain_name,
    port_proto_hash,
    service_chain_name,
)
from kproxy.modes.iptables.renderer import IptablesRenderer
from kproxy.modes.iptables.static import (
    ENSURED_JUMPS,
    JUMP_RULES,
    KUBELET_JUMP_RULES,
    JumpRule,
    nfacct_counters,
)
from kproxy.modes.iptables.writer import RenderResult, render_full, render_partial

__all__ = [
    "ENSURED_JUMPS",
    "FULL_SYNC_PERIOD_S",
    "JUMP_RULES",
    "KUBELET_JUMP_RULES",
    "NODEPORT_ADDRESSES_PRIMARY",
    "IptablesConfig",
    "IptablesMode",
    "IptablesRenderer",
    "JumpRule",
    "RenderResult",
    "SyncRecord",
    "compute_probability",
    "endpoint_chain_name",
    "ensure_jumps",
    "external_chain_name",
    "firewall_chain_name",
    "is_service_chain_name",
    "load_now",
    "local_policy_chain_name",
    "nfacct_counters",
    "port_proto_hash",
    "program",
    "render_full",
    "render_partial",
    "service_chain_name",
    "sort_restore_text",
]
