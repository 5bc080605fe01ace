"""kube-proxy's graceful termination of real servers (``pkg/proxy/ipvs/graceful_termination.go``).

Theory of operation: when an endpoint leaves a virtual server, kube-proxy calls
``GracefulDeleteRS``: it first tries to delete the real server at once (``deleteRsFunc``),
which succeeds for UDP and SCTP (``IsRsGracefulTerminationNeeded`` is false for them) and for a
server with no active and no inactive connections; otherwise the server's weight goes to 0 (no
new connections; existing ones keep it) and it joins the termination list. Every
``rsCheckDeleteInterval`` (one minute) each listed server is tried again and deleted once its
connections are gone; one already gone from the kernel just leaves the list. There is no
maximum wait. An endpoint that comes back while listed is moved out
(``MoveRSOutofGracefulDeleteList``: deleted at once, whatever its connections) and added again.

The kernel is an :class:`~kproxy.kernel.ipvs.IpvsKernel`; time is injected (``now`` in seconds, for
the list's bookkeeping; the kernel keeps its own clock).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

from emulation.ipvs import ServiceKey
from kproxy.errors import KernelError
from kproxy.kernel.ipvs import IpvsKernel

__all__ = ["CHECK_INTERVAL_S", "GracefulTermination", "ListedServer", "termination_needed"]

#: ``rsCheckDeleteInterval``.
CHECK_INTERVAL_S = 60.0

_DestKey = tuple[int, int, int]


def termination_needed(protocol: str) -> bool:
    """``IsRsGracefulTerminationNeeded``: not for UDP and SCTP."""
    return protocol.lower() not in ("udp", "sctp")


@dataclass(frozen=True, slots=True, kw_only=True)
class ListedServer:
    """A real server waiting in the termination list: its virtual service ``service``, its
    ``dest`` key ``(version, address, port)``, and ``since_s`` (when it was listed)."""

    service: ServiceKey
    dest: _DestKey
    since_s: float


class GracefulTermination:
    """The termination list of one proxier (see the module docstring).

    Args:
        kernel: the IPVS kernel the servers live in.
    """

    def __init__(self, kernel: IpvsKernel) -> None:
        self.kernel = kernel
        self._items: dict[tuple[ServiceKey, _DestKey], ListedServer] = {}
        self._last_check_s: float | None = None

    @property
    def listed(self) -> tuple[ListedServer, ...]:
        """The servers waiting, in the order they were listed."""
        return tuple(self._items.values())

    def in_list(self, service: ServiceKey, dest: _DestKey) -> bool:
        """``InTerminationList``."""
        return (service, dest) in self._items

    def _try_delete(self, service: ServiceKey, dest: _DestKey, now: float) -> bool:
        """``deleteRsFunc``: True when the server is gone (deleted now, or already absent)."""
        svc = self.kernel.virtual_server(service)
        found = svc.find(dest) if svc is not None else None
        if found is None:
            return True
        if termination_needed(service.protocol) and found.active_conns + found.inactive_conns != 0:
            return False
        self.kernel.delete_real_server(service, dest)
        return True

    def delete(self, service: ServiceKey, dest: _DestKey, now: float) -> bool:
        """``GracefulDeleteRS``: delete at once if possible, else weight 0 and list it.

        Returns:
            True when the server was deleted at once.
        """
        if self._try_delete(service, dest, now):
            return True
        svc = self.kernel.virtual_server(service)
        found = svc.find(dest) if svc is not None else None
        assert found is not None
        self.kernel.update_real_server(service, replace(found.spec, weight=0))
        self._items[(service, dest)] = ListedServer(service=service, dest=dest, since_s=now)
        return False

    def move_out(self, service: ServiceKey, dest: _DestKey, now: float) -> None:
        """``MoveRSOutofGracefulDeleteList``: delete the server at once and forget it."""
        self._items.pop((service, dest), None)
        with contextlib.suppress(KernelError):
            self.kernel.delete_real_server(service, dest)

    def check(self, now: float) -> list[ListedServer]:
        """One ``tryDeleteRs`` round: delete every listed server whose connections are gone.

        Returns:
            The servers that left the list.
        """
        self._last_check_s = now
        done = [item for key, item in list(self._items.items()) if self._try_delete(*key, now)]
        for item in done:
            del self._items[(item.service, item.dest)]
        return done

    def run_due(self, now: float) -> list[ListedServer]:
        """The one-minute ticker (``wait.Until(m.tryDeleteRs, rsCheckDeleteInterval)``): when at
        least one tick fell due since the last, check once at ``now`` (the table's clock cannot
        go back to the tick's time; connection counts only fall between packets, so the servers
        deleted are those the missed ticks would have deleted by now). The first call starts
        the ticker.

        Returns:
            The servers that left the list.
        """
        if self._last_check_s is None:
            self._last_check_s = now
            return []
        ticks = int((now - self._last_check_s) // CHECK_INTERVAL_S)
        if ticks <= 0:
            return []
        last = self._last_check_s + ticks * CHECK_INTERVAL_S
        done = self.check(now)
        self._last_check_s = last
        return done

