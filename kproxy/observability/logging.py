"""structlog configuration for the ``kproxy`` command.

Library users configure structlog (or not) themselves; only the CLI calls
:func:`configure_logging`.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

__all__ = ["LogFormat", "configure_logging"]

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
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
