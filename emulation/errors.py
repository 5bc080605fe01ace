"""The emulation package's exceptions.

``emulation`` is standalone (it never imports ``kproxy``), so it roots its own small hierarchy
at :class:`EmulationError`; ``kproxy.errors`` may wrap these at its boundary.
"""

from __future__ import annotations

__all__ = ["EmulationError", "InputError", "NetfilterError"]


class EmulationError(Exception):
    """Base class of every error raised by the kernel models."""


class InputError(EmulationError, ValueError):
    """Rejected input text (a dump, a restore file) or an operation the kernel would refuse.

    The message starts with ``line N:`` and ends with the offending text when they are known.

    Attributes:
        line: 1-based line number in the loaded text, or ``None`` when not from a file.
        text: the offending line's text (``""`` when not from a file).
    """

    def __init__(self, message: str, *, line: int | None = None, text: str = "") -> None:
        where = f"line {line}: " if line is not None else ""
        shown = f" (in {text!r})" if text else ""
        super().__init__(f"{where}{message}{shown}")
        self.line = line
        self.text = text


class NetfilterError(InputError):
    """Rejected iptables input or an impossible netfilter operation."""
