"""Helpers for the kube source tests: a recorder of emitted events and fast source options."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from kproxy.sources import Event, EventType
from kproxy.sources._kube_protocol import Backoff
from kproxy.sources.kube import KubeSource, KubeSourceOptions, api_client_factory
from tests.fakeapi.server import FakeApiServer

#: Fast timings for tests: 1 s server-side watches (so 1-2 s), 0.5 s grace, short backoff.
FAST = KubeSourceOptions(watch_timeout_s=1.0, stall_grace_s=0.5, list_timeout_s=5.0,
                         backoff=Backoff(initial_s=0.05, cap_s=0.2, jitter=0.0))


@dataclass
class Recorder:
    """Collects what a source emits."""

    events: list[Event] = field(default_factory=list)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    synced_calls: int = 0

    def emit(self, batch: Sequence[Event]) -> None:
        """The source's ``emit``."""
        self.events.extend(batch)

    def on_synced(self) -> None:
        """The source's ``synced``."""
        self.synced_calls += 1
        self.synced.set()

    def seen(self, kind: EventType, name: str) -> bool:
        """An event of ``kind`` for an object named ``name`` was emitted."""
        return any(e.type is kind and e.obj.name == name for e in self.events)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Poll ``predicate`` every 10 ms until it holds (TimeoutError after ``timeout_s``)."""
        await wait_for(predicate, timeout_s)


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` every 10 ms until it holds (TimeoutError after ``timeout_s`` seconds)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running_source(api: FakeApiServer, options: KubeSourceOptions = FAST,
                         wait_synced: bool = True) -> AsyncIterator[tuple[KubeSource, Recorder]]:
    """Run a KubeSource against ``api`` in a TaskGroup; yields once synced (unless told not to)."""
    source = KubeSource(api_client_factory(master=api.url), options=options)
    recorder = Recorder()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(source.run(recorder.emit, recorder.on_synced))
        try:
            if wait_synced:
                async with asyncio.timeout(10):
                    await recorder.synced.wait()
            yield source, recorder
        finally:
            task.cancel()


def status_of(source: KubeSource, kind: str) -> dict[str, object]:
    """The status counters of one reflector as a dict."""
    for st in source.status():
        if st.kind == kind:
            return {f: getattr(st, f) for f in st.__slots__}
    raise LookupError(kind)
