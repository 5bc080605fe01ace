"""A visible owner for the proxy's background tasks (dials, UDP session set-up).

asyncio.TaskGroup needs one ``async with`` scope around the tasks' whole life, which a
long-lived object driven by ``apply()``/``aclose()`` calls does not have. ``TaskOwner`` is the
same contract spelled as an object: every task it starts is tracked until it ends, a failure is
logged (never lost), and :meth:`aclose` cancels and awaits whatever is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

__all__ = ["TaskOwner"]

_log = structlog.get_logger("kproxy.modes.userspace")


class TaskOwner:
    """Starts, tracks and finally cancels tasks (a TaskGroup as an object)."""

    __slots__ = ("_closed", "_tasks")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str | None = None) -> asyncio.Task[None]:
        """Start ``coro`` as a tracked task on the running loop.

        Raises:
            RuntimeError: the owner is closed (the coroutine is closed unstarted).
        """
        if self._closed:
            coro.close()
            raise RuntimeError("TaskOwner is closed; no new tasks")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            # One line at error level (what failed and why); the traceback only at debug level.
            _log.error("userspace task failed", task=task.get_name(), error=str(exc) or type(exc).__name__,
                       retry="none for this connection or flow; new ones are handled as usual")
            _log.debug("userspace task failed: traceback", task=task.get_name(), exc_info=exc)

    async def aclose(self) -> None:
        """Refuse new tasks, cancel the running ones and wait until all have ended."""
        self._closed = True
        while self._tasks:
            pending = list(self._tasks)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
