"""One exception hierarchy for kproxy.

Everything kproxy raises on purpose derives from :class:`KproxyError`. The tree keeps
"your input is wrong" (:class:`ConfigError`, :class:`InvalidArgument`, :class:`InvalidObject`)
apart from "something outside failed" (:class:`SourceError`, :class:`KernelError`), and each
class also derives from the builtin a caller would naturally catch.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CsvError",
    "InvalidArgument",
    "InvalidObject",
    "InvalidTransition",
    "KernelError",
    "KproxyError",
    "NoEndpointsError",
    "PortForwardError",
    "ProtocolError",
    "SourceError",
    "UpgradeFailed",
    "VersionExpired",
]


class KproxyError(Exception):
    """Root of every error kproxy raises on purpose."""


class ConfigError(KproxyError, ValueError):
    """A flag, option or configuration file is wrong; the message names it and the fix."""


class CsvError(ConfigError):
    """A comma-separated flag value Go's ``encoding/csv`` would refuse (the message is Go's)."""


class InvalidArgument(KproxyError, TypeError):
    """A library call got an argument of the wrong type or an impossible value."""


class InvalidObject(KproxyError, ValueError):
    """A Kubernetes object (Service, EndpointSlice, Endpoints) failed validation.

    Attributes:
        source: where the object came from (a file path, ``memory``, or ``kube``), or ``""``.
        obj: ``"Kind namespace/name"`` as far as it could be read.
        field: the JSON path of the bad field, e.g. ``spec.ports[0].port``.
        problem: what was wrong, with the value that arrived.
    """

    def __init__(self, *, source: str = "", obj: str = "", field: str = "", problem: str) -> None:
        self.source = source
        self.obj = obj
        self.field = field
        self.problem = problem
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [p for p in (self.source, self.obj, self.field) if p]
        where = ": ".join(parts)
        return f"{where}: {self.problem}" if where else self.problem

    def with_source(self, source: str) -> InvalidObject:
        """Return a copy of this error that names ``source`` (a file path) as its origin."""
        return InvalidObject(source=source, obj=self.obj, field=self.field, problem=self.problem)


class SourceError(KproxyError, OSError):
    """A source of objects (manifest files, the API server) could not be read."""


class KernelError(KproxyError, OSError):
    """Applying state to a kernel (emulated or real) failed; the previous state stays."""


class NoEndpointsError(KproxyError, LookupError):
    """A Service port has no usable endpoint to send a new connection to."""


class InvalidTransition(KproxyError, RuntimeError):
    """A state machine got an event that is illegal in its current state.

    The message names the machine, the state and the event.
    """


class ProtocolError(KproxyError, ValueError):
    """A peer broke a wire protocol (SPDY/3.1, the port-forward stream protocol, WebSocket).

    Attributes:
        status: the SPDY status code that describes it (RST_STREAM or GOAWAY), 1 = PROTOCOL_ERROR.
    """

    def __init__(self, message: str, *, status: int = 1) -> None:
        self.status = status
        super().__init__(message)


class PortForwardError(KproxyError, ConnectionError):
    """A port-forward failed: the upgrade was refused, the pod went away or a stream was reset."""


class UpgradeFailed(PortForwardError):
    """The server answered a protocol upgrade with something else than 101.

    Attributes:
        status: the HTTP status the server answered.
        body: its body (a Status document, usually).
    """

    def __init__(self, status: int, body: str) -> None:
        self.status, self.body = status, body
        super().__init__(f"upgrade refused with HTTP {status}: {body[:200]}")


class VersionExpired(KproxyError, LookupError):
    """A resource version older than the history an API server keeps (410 Gone): relist."""
