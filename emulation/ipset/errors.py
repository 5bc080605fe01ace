"""The ipset model's exception."""

from __future__ import annotations

from emulation.errors import EmulationError

__all__ = ["IpsetError"]


class IpsetError(EmulationError, ValueError):
    """Rejected ``ipset`` input or an impossible set operation.

    Attributes:
        line: 1-based line number in the restore input, or ``None`` when not from a file.
        text: the offending line (``""`` when not from a file).
    """

    def __init__(self, message: str, *, line: int | None = None, text: str = "") -> None:
        where = f"line {line}: " if line is not None else ""
        shown = f" (in {text!r})" if text else ""
        super().__init__(f"{where}{message}{shown}")
        self.line = line
        self.text = text
