"""The ipset model's exception."""

from __future__ import annotations

from emulation.errors import InputError

__all__ = ["IpsetError"]


class IpsetError(InputError):
    """Rejected ``ipset`` input or an impossible set operation."""
