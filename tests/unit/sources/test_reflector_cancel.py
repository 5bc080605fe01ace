"""A reflector told to stop stops, even when its watchdog declares the watch stalled at that moment."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from kproxy.clock import FakeClock
from kproxy.sources._kube_reflector import Reflector, ReflectorOptions


class _Content:
    def __init__(self) -> None:
        self.reading = asyncio.Event()

    async def readany(self) -> bytes:
        self.reading.set()
        await asyncio.Event().wait()  # a watch that never sends anything
        return b""


class _Response:
    def __init__(self, body: bytes, content: _Content) -> None:
        self.status = 200
        self._body = body
        self.content = content

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


async def test_cancel_landing_as_the_watchdog_fires_stops_the_reflector() -> None:
    """Cancelling the reflector in the same loop turn as a watch stall ends run() with CancelledError."""
    clock = FakeClock()
    content = _Content()
    body = json.dumps({"kind": "ServiceList", "metadata": {"resourceVersion": "7"}, "items": []}).encode()

    async def call(**kwargs: Any) -> _Response:
        return _Response(body, content)

    reflector = Reflector(kind="Service", api_version="v1", call=call, selector="", emit=lambda events: None,
                          on_listed=lambda kind: None, clock=clock, rng=random.Random(0),
                          options=ReflectorOptions(watch_timeout_s=1.0, stall_grace_s=1.0))
    task = asyncio.create_task(reflector.run())
    async with asyncio.timeout(5):
        await content.reading.wait()            # listed, now watching a silent stream
        while clock.sleeper_count == 0:         # the watchdog sleeps on the fake clock
            await asyncio.sleep(0)
    clock.advance(10.0)                         # the watchdog wakes and declares a stall ...
    await asyncio.sleep(0)
    task.cancel()                               # ... as the reflector is told to stop
    try:
        async with asyncio.timeout(5):
            await task
    except asyncio.CancelledError:
        pass
    assert task.cancelled(), "the reflector went on after it was cancelled"
