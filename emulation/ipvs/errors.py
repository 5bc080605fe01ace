"""The IPVS model's exception: bad input text, an impossible table operation."""

from __future__ import annotations

from emulation.errors import InputError

__all__ = ["IpvsError"]


class IpvsError(InputError):
    """Rejected ``ipvsadm`` input or an operation the kernel would refuse (it names the errno)."""
