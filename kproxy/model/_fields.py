"""Small helpers to read API dicts field by field, naming the field in every error.

A :class:`Problems` collects :class:`~kproxy.errors.InvalidObject` errors while a parser keeps
going: a parser skips the smallest part that is wrong (an address, a port, an object) and
serves the rest, as the issue "one bad Service never stops the others" demands.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kproxy.errors import InvalidObject

__all__ = ["Problems", "as_bool", "as_int", "as_list", "as_map", "as_str", "check_ip"]


@dataclass(slots=True)
class Problems:
    """Accumulates the validation errors of one object.

    Attributes:
        obj: ``"Kind namespace/name"``, used in every error.
        source: where the object came from, used in every error.
        errors: the errors so far, in the order found.
    """

    obj: str
    source: str = ""
    errors: list[InvalidObject] = field(default_factory=list)

    def add(self, field_path: str, problem: str) -> None:
        """Record that ``field_path`` is wrong, saying how."""
        self.errors.append(
            InvalidObject(source=self.source, obj=self.obj, field=field_path, problem=problem)
        )

    def fail(self, field_path: str, problem: str) -> InvalidObject:
        """Build (not record) the error that rejects the whole object."""
        return InvalidObject(source=self.source, obj=self.obj, field=field_path, problem=problem)


def as_map(value: Any, path: str, problems: Problems) -> Mapping[str, Any] | None:
    """Return ``value`` if it is a mapping (``None`` stays ``None``); else record and return None."""
    if value is None or isinstance(value, Mapping):
        return value
    problems.add(path, f"expected an object, got {type(value).__name__} {value!r}")
    return None


def as_list(value: Any, path: str, problems: Problems) -> list[Any]:
    """Return ``value`` as a list (``None`` is empty); record anything else and return []."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    problems.add(path, f"expected a list, got {type(value).__name__} {value!r}")
    return []


def as_str(value: Any, path: str, problems: Problems, default: str = "") -> str | None:
    """Return ``value`` as a string (``None`` gives ``default``); record a non-string, give None."""
    if value is None:
        return default
    if isinstance(value, str):
        return value
    problems.add(path, f"expected a string, got {type(value).__name__} {value!r}")
    return None


def as_int(value: Any, path: str, problems: Problems) -> int | None:
    """Return ``value`` if it is an int (not a bool); record anything else and return None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    problems.add(path, f"expected an integer, got {type(value).__name__} {value!r}")
    return None


def as_bool(value: Any, path: str, problems: Problems, default: bool) -> bool:
    """Return ``value`` as a bool, ``default`` when absent; record a non-bool (giving default)."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    problems.add(path, f"expected true or false, got {value!r}")
    return default


def check_ip(value: Any, path: str, problems: Problems) -> str | None:
    """Return the canonical text of an IP address, or record the problem and return None.

    The canonical form is Python's ``str(ip_address(...))``: IPv6 compressed and lower case,
    as Go's ``net.IP.String()`` prints it.
    """
    if not isinstance(value, str):
        problems.add(path, f"expected an IP address, got {value!r}")
        return None
    text = value.strip()
    if "%" in text:
        # Python accepts scoped IPv6 ("fe80::1%eth0"); Go's net.ParseIP, which validation and
        # kube-proxy use, does not.
        problems.add(path, f"{value!r} is not a valid IP address (zones are not allowed)")
        return None
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        problems.add(path, f"{value!r} is not a valid IP address")
        return None
