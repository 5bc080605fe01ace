"""The IPVS model's exception: bad input text, an impossible table operation."""

from __future__ import annotations

from emulation.errors import EmulationError

__all__ = ["IpvsError"]


class IpvsError(EmulationError, ValueError):
    """Rejected ``ipvsadm`` input or an operation the kernel would refuse (it names the errno).

    Attributes:
        line: 1-based line number in the loaded text, or ``None`` when not from a file.
        text: the offending line (``""`` when not from a file).
    """

    def __init__(self, message: str, *, line: int | None = None, text: str = "") -> None:
        where = f"line {line}: " if line is not None else ""
        shown = f" (in {text!r})" if text else ""
        super().__init__(f"{where}{message}{shown}")
        self.line = line
        self.text = text
