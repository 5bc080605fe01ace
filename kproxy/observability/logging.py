"""structlog configuration for the ``kproxy`` command.

Library users configure structlog (or not) themselves; only the CLI calls
:func:`configure_logging`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal, TextIO, cast

import structlog

__all__ = ["LogFormat", "configure_logging"]


class _Resilient:
    """A text stream whose failures never reach the caller: logging must not stop the proxy.

    When the reader of a pipe goes away (``kproxy run 2>&1 | head``), writes fail with
    BrokenPipeError; from then on log lines are dropped, and the process's stderr is pointed
    at /dev/null so the interpreter's final flush cannot fail either.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream: TextIO | None = stream

    def write(self, text: str) -> int:
        if self._stream is None:
            return len(text)
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            self._give_up()
            return len(text)

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self._give_up()

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def _give_up(self) -> None:
        stream, self._stream = self._stream, None
        if stream is sys.stderr and stream is not None:
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass

LogFormat = Literal["console", "json"]


def configure_logging(
    fmt: LogFormat = "console", *, level: str = "info", stream: TextIO | None = None
) -> None:
    """Send structlog events to ``stream`` (default stderr) as console lines or JSON lines.

    Args:
        fmt: ``console`` (human readable, no colours when not a TTY) or ``json`` (one object
            per line, with ``timestamp``, ``level``, ``event`` and the event's fields).
        level: the minimum level name (debug, info, warning, error).
        stream: where to write.

    Raises:
        ValueError: unknown ``fmt`` or ``level``.
    """
    out = stream if stream is not None else sys.stderr
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; expected debug, info, warning or error")
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    elif fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    else:
        raise ValueError(f"unknown log format {fmt!r}; expected console or json")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _Resilient(out))),
        cache_logger_on_first_use=False,
    )
