"""A failed sync is one log line: what failed, why, and when it is retried; no traceback, no internals."""

from __future__ import annotations

from structlog.testing import capture_logs

from kproxy.errors import KernelError
from kproxy.model import NodeConfig, Snapshot
from kproxy.observability import Observability, ObservabilityOptions
from kproxy.sources import MemorySource
from kproxy.sync import FakeClock, SyncEngine
from tests.unit.sync.builders import running, svc


class _Refusing:
    """A consumer whose kernel refuses the first ``count`` snapshots."""

    family = "IPv6"

    def __init__(self, count: int) -> None:
        self.count = count

    async def apply(self, snapshot: Snapshot) -> None:
        """Refuse, then accept."""
        if self.count:
            self.count -= 1
            raise KernelError("iptables-restore failed: line 3: unknown chain KUBE-NOPE")


async def test_a_failed_sync_logs_one_line_with_the_retry_delay() -> None:
    """One error line names the consumer, the kernel's reason and 'retrying in 30.0 s'; traceback at debug."""
    clock = FakeClock()
    obs = Observability(ObservabilityOptions(healthz_bind_address="", metrics_bind_address=""),
                        clock=clock, wall=lambda: 1000.0)
    source = MemorySource([svc("web", "10.96.0.10")])
    engine = SyncEngine(obs.instruments.source(source), NodeConfig(hostname="n"),
                        [obs.instruments.consumer(_Refusing(1))], clock=clock)
    obs.bind(engine)
    with capture_logs() as logs:
        async with running(engine.run):
            await clock.run_for(31)
    assert engine.sync_count == 1 and engine.failure_count == 1
    errors = [e for e in logs if e["log_level"] in ("error", "warning")]
    assert len(errors) == 1, errors
    line = errors[0]
    assert line["event"].startswith("sync failed; retrying in 30.0 s")
    assert line["retry_in_s"] == 30.0
    assert "_Refusing (IPv6)" in line["error"] and "unknown chain KUBE-NOPE" in line["error"]
    assert "\n" not in line["error"]
    assert not {"exc_info", "error_type", "retry_at", "consumer"} & set(line)
    assert "_TimedConsumer" not in str(line)
    assert any(e["log_level"] == "debug" and "exc_info" in e for e in logs)
