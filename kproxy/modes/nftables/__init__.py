"""kube-proxy's nftables mode: a pure renderer from a Snapshot to an ``nft -f`` transaction.

- :func:`render_transaction` writes what kube-proxy's nftables proxier writes on a full sync
  (``pkg/proxy/nftables/proxier.go``, the newest layout); :class:`NftablesRenderer` keeps the state
  between syncs (full at start and after a failure; otherwise only changed chains and elements,
  stale chains flushed and deleted later); :class:`NftablesMode` applies it through an
  :class:`~kproxy.kernel.nftables.NftablesKernel`.
- :func:`sort_transaction` and :func:`canonical_listing` order text for comparisons.

Ports are walked sorted by ServicePortName rather than in Go's random map order.
"""

from kproxy.modes.nftables.canonical import canonical_listing, sort_transaction
from kproxy.modes.nftables.config import NODEPORT_ADDRESSES_PRIMARY, NftablesConfig
from kproxy.modes.nftables.mode import FULL_SYNC_PERIOD_S, NftablesMode, SyncRecord
from kproxy.modes.nftables.names import (
    TABLE,
    affinity_set_name,
    endpoint_chain_name,
    hash_and_truncate,
    is_service_chain_name,
    service_chain_base,
)
from kproxy.modes.nftables.renderer import (
    STALE_CHAIN_AGE_S,
    NftablesRenderer,
    RenderResult,
    render_transaction,
)

__all__ = [
    "FULL_SYNC_PERIOD_S",
    "NODEPORT_ADDRESSES_PRIMARY",
    "STALE_CHAIN_AGE_S",
    "TABLE",
    "NftablesConfig",
    "NftablesMode",
    "NftablesRenderer",
    "RenderResult",
    "SyncRecord",
    "affinity_set_name",
    "canonical_listing",
    "endpoint_chain_name",
    "hash_and_truncate",
    "is_service_chain_name",
    "render_transaction",
    "service_chain_base",
    "sort_transaction",
]
