"""The nftables mode as a sync-engine consumer: render, apply, remember, as kube-proxy's sync loop.

Theory of operation
-------------------
:class:`NftablesMode` is what the sync engine calls with each Snapshot (``await
mode.apply(snapshot)``). It follows kube-proxy's nftables ``syncProxyRules``:

1. Decide full or partial: full at start, after a failure, when asked (:meth:`request_full`) and
   when the last full sync is older than ``full_sync_period_s`` (``FullSyncPeriod``, one hour).
2. On a full sync read the family's ``kube-proxy`` table (``nft list table``): its per-service
   chains and sets, so those an earlier run left are flushed (and later deleted) or deleted. A
   partial sync trusts what the renderer committed (kube-proxy lists every sync; as the table's
   only writer the outcome is the same, without reading 100,000 chains each time).
3. Render with :class:`~kproxy.modes.nftables.NftablesRenderer`; run the stale-chain deletions
   first in their own transaction (a failure there is logged, as kube-proxy does: the chains
   are found again next time), then the sync's transaction.
4. On success commit; on :class:`~kproxy.errors.KernelError` mark the renderer failed (the next
   sync is full) and re-raise, so the engine retries.
5. After a successful sync delete stale UDP/SCTP conntrack entries
   (:func:`~kproxy.kernel.conntrack.stale_conntrack_filters`); a failure is logged, never fatal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from kproxy.errors import InvalidArgument, KernelError
from kproxy.kernel.conntrack import stale_conntrack_filters
from kproxy.kernel.nftables import NftablesKernel, table_objects
from kproxy.model.snapshot import Snapshot
from kproxy.modes.nftables.config import NftablesConfig
from kproxy.modes.nftables.renderer import NftablesRenderer, RenderResult

__all__ = ["FULL_SYNC_PERIOD_S", "NftablesMode", "SyncRecord"]

#: kube-proxy's ``proxyutil.FullSyncPeriod``: one hour.
FULL_SYNC_PERIOD_S = 3600.0

_log = structlog.get_logger("kproxy.nftables")


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncRecord:
    """One sync attempt: snapshot ``revision``, ``full``, ``ok``, clock time ``at_s`` (seconds),
    the rendered ``result`` and the kernel's ``error`` (``""`` when ok)."""

    revision: int
    full: bool
    ok: bool
    at_s: float
    result: RenderResult
    error: str = ""


class NftablesMode:
    """Keep one IP family's ``kube-proxy`` nftables table in sync with the snapshots.

    Args:
        config: the proxier's settings; its ``family`` must be the kernel's.
        kernel: where the transactions go (any :class:`~kproxy.kernel.NftablesKernel`).
        now: the clock, in seconds (``time.monotonic`` or a fake clock's ``now``).
        full_sync_period_s: force a full sync when the last one is older than this.
        history: how many :class:`SyncRecord` to keep (0: none).

    Raises:
        InvalidArgument: the families differ, the kernel is not an NftablesKernel, or a bound < 0.
    """

    def __init__(self, config: NftablesConfig, kernel: NftablesKernel, *, now: Callable[[], float],
                 full_sync_period_s: float = FULL_SYNC_PERIOD_S, history: int = 16) -> None:
        if not isinstance(kernel, NftablesKernel):
            raise InvalidArgument(f"kernel must implement kproxy.kernel.NftablesKernel, got {kernel!r}")
        if kernel.family is not config.family:
            raise InvalidArgument(f"config renders {config.family} but the kernel is {kernel.family}; "
                                  "use config.for_family(kernel.family)")
        if not full_sync_period_s > 0:
            raise InvalidArgument(f"full_sync_period_s must be > 0 seconds, got {full_sync_period_s=}")
        if history < 0:
            raise InvalidArgument(f"history must be >= 0, got {history=}")
        self.config = config
        self.kernel = kernel
        self.renderer = NftablesRenderer(config)
        self._now = now
        self._period_s = full_sync_period_s
        self._last_full_s: float | None = None
        self._keep = history
        self._synced: Snapshot | None = None
        self.history: list[SyncRecord] = []
        """The latest sync attempts, oldest first."""

    def request_full(self) -> None:
        """Make the next sync full (node labels changed, rules lost)."""
        self.renderer.request_full()

    async def apply(self, snapshot: Snapshot) -> None:
        """Program ``snapshot`` (see the module docstring).

        Raises:
            KernelError: the kernel refused the transaction; the next sync will be full.
        """
        now_s = self._now()
        if self._last_full_s is not None and now_s - self._last_full_s > self._period_s:
            self.renderer.request_full()
        if self.renderer.needs_full or self.renderer.applied is None:
            chains, sets = table_objects(await self.kernel.list_ruleset())
            result = self.renderer.render(snapshot, existing_chains=chains, existing_sets=sets, now_s=now_s)
        else:
            # The table's only writer knows what it holds; listing 100,000 chains every sync would
            # cost more than the sync (kube-proxy lists; the result is the same).
            result = self.renderer.render(snapshot, now_s=now_s)
        if result.cleanup:
            try:
                await self.kernel.run(result.cleanup)
            except KernelError as err:
                _log.warning("deleting stale nftables chains failed; will retry", error=str(err),
                             family=str(self.config.family))
        try:
            await self.kernel.run(result.text)
        except KernelError as err:
            self.renderer.failed()
            self._record(snapshot, result, now_s, str(err))
            _log.warning("nftables sync failed", family=str(self.config.family), full=result.full,
                         revision=snapshot.revision, error=str(err))
            raise
        self.renderer.commit(result)
        if result.full:
            self._last_full_s = now_s
        self._record(snapshot, result, now_s, "")
        previous, self._synced = self._synced, snapshot
        await self._clean_conntrack(previous, snapshot)
        _log.debug("nftables synced", family=str(self.config.family), full=result.full,
                   revision=snapshot.revision, operations=result.operations,
                   written_ports=result.written_ports, deleted_chains=len(result.deleted_chains))

    async def _clean_conntrack(self, previous: Snapshot | None, snapshot: Snapshot) -> None:
        filters = stale_conntrack_filters(previous, snapshot, self.config.family)
        if not filters:
            return
        try:
            await self.kernel.clear_conntrack(filters)
        except KernelError as err:
            _log.warning("conntrack cleanup failed", family=str(self.config.family), error=str(err))

    def _record(self, snapshot: Snapshot, result: RenderResult, now_s: float, error: str) -> None:
        if not self._keep:
            return
        self.history.append(SyncRecord(revision=snapshot.revision, full=result.full, ok=not error,
                                       at_s=now_s, result=result, error=error))
        del self.history[:-self._keep]
