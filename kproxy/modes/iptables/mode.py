"""The iptables mode as a sync-engine consumer: render, apply, remember, as kube-proxy's sync loop.

Theory of operation
-------------------
:class:`IptablesMode` is what :class:`~kproxy.sync.engine.SyncEngine` calls with each Snapshot
(``await mode.apply(snapshot)``). It follows kube-proxy's ``syncProxyRules``
(pkg/proxy/iptables/proxier.go):

1. Decide full or partial. A sync is full at start, after any failure, when asked
   (:meth:`IptablesMode.request_full`: node labels changed, rules flushed behind our back), and
   when the last full sync is older than ``full_sync_period_s`` (kube-proxy's
   ``doFullSync := needFullSync || time.Since(lastFullSync) > proxyutil.FullSyncPeriod``, one
   hour since kubernetes PR 129329; kube-proxy skips the periodic one in large-cluster mode since
   PR 138571, and so does this). Otherwise it is partial (KEP-3453).
2. On a full sync read the nat chains the kernel holds (``iptables-save -t nat``) so that stale
   service chains left by an earlier run are deleted.
3. Render with :class:`~kproxy.modes.iptables.IptablesRenderer` and program it through the
   narrow :class:`~kproxy.kernel.netfilter.NetfilterKernel` (:func:`program`, the one place the
   sequence is written: on a full result ``route_localnet`` when localhost NodePorts are served,
   the nfacct objects, then ``EnsureChain`` + ``EnsureRule(Prepend)`` of each of
   :data:`~kproxy.modes.iptables.ENSURED_JUMPS`; then the restore).
4. On success :meth:`~kproxy.modes.iptables.IptablesRenderer.commit`; on
   :class:`~kproxy.errors.KernelError` :meth:`~kproxy.modes.iptables.IptablesRenderer.failed` (so
   the next sync is full, as kube-proxy's ``needFullSync = true``) and re-raise, so the engine
   retries.
5. After a successful sync, delete stale UDP/SCTP conntrack entries
   computed by :func:`~kproxy.kernel.conntrack.stale_conntrack_filters` from the last
   successfully applied Snapshot and this one (kube-proxy's ``conntrack.CleanStaleEntries``). A
   failure there is never fatal (as kube-proxy); it is logged once with what is lost (stale UDP
   and SCTP flows keep their old endpoint), again at debug level only, and once more when the
   cleanup works again (a missing ``conntrack`` tool would otherwise log at every sync).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import structlog

from kproxy.errors import InvalidArgument, KernelError
from kproxy.kernel.conntrack import stale_conntrack_filters
from kproxy.kernel.emulated import EmulatedNetfilter, run_now
from kproxy.kernel.netfilter import ROUTE_LOCALNET, NetfilterKernel
from kproxy.model.names import IPFamily
from kproxy.model.snapshot import Snapshot
from kproxy.modes.iptables.config import IptablesConfig
from kproxy.modes.iptables.renderer import IptablesRenderer
from kproxy.modes.iptables.static import ENSURED_JUMPS, JumpRule, nfacct_counters
from kproxy.modes.iptables.writer import RenderResult

__all__ = ["FULL_SYNC_PERIOD_S", "IptablesMode", "SyncRecord", "ensure_jumps", "load_now", "program"]

#: kube-proxy's ``proxyutil.FullSyncPeriod``: one hour.
FULL_SYNC_PERIOD_S = 3600.0

_log = structlog.get_logger("kproxy.iptables")


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncRecord:
    """One sync attempt.

    Attributes:
        revision: the snapshot's revision.
        full: it was a full sync.
        ok: the kernel accepted it.
        at_s: clock time (seconds) when it started.
        result: the rendered input.
        error: the kernel's complaint when ``ok`` is false, else ``""``.
    """

    revision: int
    full: bool
    ok: bool
    at_s: float
    result: RenderResult
    error: str = ""


async def ensure_jumps(kernel: NetfilterKernel, jumps: Iterable[JumpRule] = ENSURED_JUMPS) -> None:
    """kube-proxy's ``EnsureChain`` of each jump's target, then ``EnsureRule(Prepend)`` of the jump.

    Raises:
        KernelError: a chain or a rule was refused.
    """
    for jump in jumps:
        await kernel.ensure_chain(jump.table, jump.target)
        await kernel.ensure_rule(jump.table, jump.chain, jump.argv)


async def program(kernel: NetfilterKernel, result: RenderResult, *, nfacct: Sequence[str] = ()) -> None:
    """Put ``result`` into ``kernel`` in kube-proxy's order (``syncProxyRules``).

    On a full result: ``route_localnet=1`` when the rules serve IPv4 localhost NodePorts (issue
    90259), the nfacct objects ``nfacct``, then :func:`ensure_jumps`; then, full or partial,
    ``iptables-restore --noflush --counters`` of the text.

    Raises:
        KernelError: a step was refused; the restore itself changed nothing.
    """
    if result.full:
        if result.route_localnet and kernel.family is IPFamily.IPv4:
            await kernel.ensure_sysctl(ROUTE_LOCALNET, "1")
        for name in nfacct:
            await kernel.create_nfacct(name)
        await ensure_jumps(kernel)
    await kernel.restore(result.text, noflush=True, counters=True)


def load_now(kernel: EmulatedNetfilter, result: RenderResult, *, nfacct: Sequence[str] = ()) -> None:
    """:func:`program` on an emulated kernel, synchronously (traces and tests build nodes so).

    Raises:
        KernelError: see :func:`program`.
    """
    run_now(program(kernel, result, nfacct=nfacct))


class IptablesMode:
    """Keep one IP family's iptables rules in a kernel in sync with the snapshots.

    Args:
        config: the proxier's settings; its ``family`` must be the applier's.
        kernel: where the rules go (:class:`~kproxy.kernel.EmulatedNetfilter`,
            :class:`~kproxy.kernel.LinuxNetfilter`, or any :class:`~kproxy.kernel.NetfilterKernel`).
        now: the clock, in seconds (e.g. ``time.monotonic`` or a fake clock's ``now``).
        full_sync_period_s: force a full sync when the last one is older than this.
        history: how many :class:`SyncRecord` to keep in :attr:`history` (0: none).

    Raises:
        InvalidArgument: the families differ, the kernel lacks ``apply``, or a period <= 0.
    """

    def __init__(self, config: IptablesConfig, kernel: NetfilterKernel, *, now: Callable[[], float],
                 full_sync_period_s: float = FULL_SYNC_PERIOD_S, history: int = 16) -> None:
        if not isinstance(kernel, NetfilterKernel):
            raise InvalidArgument(f"kernel must implement kproxy.kernel.NetfilterKernel, got {kernel!r}")
        if kernel.family is not config.family:
            raise InvalidArgument(f"config renders {config.family} but the kernel is {kernel.family}; "
                                  "use config.for_family(kernel.family)")
        if not full_sync_period_s > 0:
            raise InvalidArgument(f"full_sync_period_s must be > 0 seconds, got {full_sync_period_s=}")
        if history < 0:
            raise InvalidArgument(f"history must be >= 0, got {history=}")
        self.config = config
        self.kernel = kernel
        self.renderer = IptablesRenderer(config)
        self._now = now
        self._period_s = full_sync_period_s
        self._nfacct = nfacct_counters(config)
        self._last_full_s: float | None = None
        self._last_large = False
        self._keep = history
        self._synced: Snapshot | None = None
        self._conntrack_failing = False
        self.history: list[SyncRecord] = []
        """The latest sync attempts, oldest first."""

    def request_full(self) -> None:
        """Make the next sync full (kube-proxy's ``forceSyncProxyRules``)."""
        self.renderer.request_full()

    @property
    def needs_full(self) -> bool:
        """The next sync will be full (not counting the periodic one)."""
        return self.renderer.needs_full

    def _periodic_due(self, now_s: float) -> bool:
        if self._last_full_s is None or self._last_large:
            return False
        return now_s - self._last_full_s > self._period_s

    async def apply(self, snapshot: Snapshot) -> None:
        """Program ``snapshot`` (see the module docstring).

        Raises:
            KernelError: the kernel refused; the next sync will be full.
        """
        now_s = self._now()
        if self._periodic_due(now_s):
            self.renderer.request_full()
        full = self.renderer.needs_full or self.renderer.applied is None
        existing = await self.kernel.list_chains("nat") if full else frozenset()
        result = self.renderer.render(snapshot, existing_chains=existing)
        try:
            await program(self.kernel, result, nfacct=self._nfacct)
        except KernelError as err:
            self.renderer.failed()
            self._record(snapshot, result, now_s, str(err))
            _log.warning("iptables sync failed", family=str(self.config.family), full=result.full,
                         revision=snapshot.revision, error=str(err))
            raise
        self.renderer.commit(result)
        if result.full:
            self._last_full_s = now_s
        self._last_large = result.large_cluster
        self._record(snapshot, result, now_s, "")
        previous, self._synced = self._synced, snapshot
        await self._clean_conntrack(previous, snapshot)
        _log.debug("iptables synced", family=str(self.config.family), full=result.full,
                   revision=snapshot.revision, written_ports=result.written_ports,
                   filter_rules=result.filter_rules, nat_rules=result.nat_rules,
                   deleted_chains=len(result.deleted_chains))

    async def _clean_conntrack(self, previous: Snapshot | None, snapshot: Snapshot) -> None:
        filters = stale_conntrack_filters(previous, snapshot, self.config.family)
        if not filters:
            return
        family = str(self.config.family)
        try:
            deleted = await self.kernel.clear_conntrack(filters)
        except KernelError as err:
            log = _log.debug if self._conntrack_failing else _log.warning
            log("conntrack cleanup failed; stale UDP and SCTP flows are not flushed and keep reaching "
                "removed endpoints until it works (said once; install the conntrack tool)",
                family=family, revision=snapshot.revision, error=str(err))
            self._conntrack_failing = True
            return
        if self._conntrack_failing:
            self._conntrack_failing = False
            _log.info("conntrack cleanup works again", family=family, revision=snapshot.revision)
        _log.debug("conntrack cleaned", family=str(self.config.family), revision=snapshot.revision,
                   filters=len(filters), deleted=deleted)

    def _record(self, snapshot: Snapshot, result: RenderResult, now_s: float, error: str) -> None:
        if not self._keep:
            return
        self.history.append(SyncRecord(revision=snapshot.revision, full=result.full, ok=not error,
                                       at_s=now_s, result=result, error=error))
        del self.history[:-self._keep]
