"""A virtual service inside the kernel: its destination list, its scheduler, its trash.

``ip_vs_ctl.c`` semantics:

* ``add_dest`` (``ip_vs_add_dest``): ``-EEXIST`` if the server is in the list; otherwise a
  server of the same address and port still in the trash (deleted, but connections still point
  at it) is revived with its counters, else a new one is made; either way
  ``__ip_vs_update_dest(add=1)`` links it with ``list_add_rcu`` -- at the **head** of the list.
* ``edit_dest`` (``ip_vs_edit_dest``): ``__ip_vs_update_dest(add=0)``: in place, then ``upd_dest``.
* ``del_dest`` (``ip_vs_del_dest``): ``__ip_vs_unlink_dest`` clears ``AVAILABLE``, unlinks it and
  calls ``del_dest``; the server moves to the trash while connections still reference it.
* In ``__ip_vs_update_dest``: ``last_weight`` takes the new weight when adding or when it is
  non-zero; the overload flag is cleared when the new upper threshold is 0 or larger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from emulation.ipvs.errors import IpvsError
from emulation.ipvs.model import Dest, DestSpec, ServiceSpec
from emulation.ipvs.sched_base import SchedInput, Scheduler
from emulation.ipvs.sched_hash import DestinationHashing, SourceHashing
from emulation.ipvs.sched_lc import (
    FailOver,
    LeastConnection,
    NeverQueue,
    Overflow,
    ShortestExpectedDelay,
    WeightedLeastConnection,
)
from emulation.ipvs.sched_mh import DEFAULT_TAB_INDEX, MaglevHashing
from emulation.ipvs.sched_rr import RoundRobin, WeightedRoundRobin

__all__ = ["SCHEDULERS", "Service", "make_scheduler"]

SCHEDULERS: dict[str, Callable[[], Scheduler]] = {
    "rr": RoundRobin,
    "wrr": WeightedRoundRobin,
    "lc": LeastConnection,
    "wlc": WeightedLeastConnection,
    "sed": ShortestExpectedDelay,
    "nq": NeverQueue,
    "fo": FailOver,
    "ovf": Overflow,
    "sh": SourceHashing,
    "dh": DestinationHashing,
    "mh": MaglevHashing,
}


def make_scheduler(name: str, *, mh_tab_index: int = DEFAULT_TAB_INDEX) -> Scheduler:
    """A fresh scheduler by name (``ip_vs_scheduler_get``).

    Raises:
        IpvsError: the kernel has no such scheduler module here (``-ENOENT``); lblc, lblcr and
            twos are not modelled.
    """
    if name == "mh":
        return MaglevHashing(mh_tab_index)
    factory = SCHEDULERS.get(name)
    if factory is None:
        raise IpvsError(f"scheduler {name!r} is not modelled; expected one of {sorted(SCHEDULERS)}")
    return factory()


class Service:
    """One virtual service (``struct ip_vs_service``); ``dests`` is head first.

    Args:
        spec: the service as configured.
        mh_tab_index: ``CONFIG_IP_VS_MH_TAB_INDEX`` for an ``mh`` scheduler.
    """

    __slots__ = ("_by_key", "dests", "mh_tab_index", "scheduler", "spec", "trash")

    def __init__(self, spec: ServiceSpec, *, mh_tab_index: int = DEFAULT_TAB_INDEX) -> None:
        self.spec = spec
        self.mh_tab_index = mh_tab_index
        self.dests: list[Dest] = []
        self._by_key: dict[tuple[int, int, int], Dest] = {}
        self.trash: dict[tuple[int, int, int], Dest] = {}
        self.scheduler = make_scheduler(spec.scheduler, mh_tab_index=mh_tab_index)
        self.scheduler.init_service(self.dests, spec.flags)

    def edit(self, spec: ServiceSpec) -> None:
        """``ip_vs_edit_service``: a new scheduler is bound (fresh state) only if its name changed."""
        if spec.key != self.spec.key:
            raise IpvsError(f"cannot edit {self.spec.key} into {spec.key}; delete and add instead")
        changed = spec.scheduler != self.spec.scheduler
        if changed:
            sched = make_scheduler(spec.scheduler, mh_tab_index=self.mh_tab_index)
        self.spec = spec
        if changed:
            self.scheduler = sched
            sched.init_service(self.dests, spec.flags)

    def find(self, spec_or_key: DestSpec | tuple[int, int, int]) -> Dest | None:
        """The linked real server with this address and port, or ``None``."""
        key = spec_or_key.key if isinstance(spec_or_key, DestSpec) else spec_or_key
        return self._by_key.get(key)

    def add_dest(self, spec: DestSpec) -> Dest:
        """``ip_vs_add_dest``: link a real server at the head of the list.

        Raises:
            IpvsError: the server already exists (``-EEXIST``), or mh cannot fit it.
        """
        if spec.key in self._by_key:
            raise IpvsError(f"real server {spec.key} already exists in {self.spec.key} (EEXIST)")
        dest = self.trash.pop(spec.key, None) or Dest(spec=spec)
        self._update(dest, spec, add=True)
        return dest

    def edit_dest(self, spec: DestSpec) -> Dest:
        """``ip_vs_edit_dest``: change weight, forwarding or thresholds in place.

        Raises:
            IpvsError: no such real server (``-ENOENT``).
        """
        dest = self._by_key.get(spec.key)
        if dest is None:
            raise IpvsError(f"no real server {spec.key} in {self.spec.key} (ENOENT)")
        self._update(dest, spec, add=False)
        return dest

    def _update(self, dest: Dest, spec: DestSpec, *, add: bool) -> None:
        # __ip_vs_update_dest
        if add or spec.weight != 0:
            dest.last_weight = spec.weight
        dest.weight = spec.weight
        dest.spec = spec
        dest.available = True
        if spec.u_threshold == 0 or spec.u_threshold > dest.u_threshold:
            dest.overloaded = False
        dest.u_threshold = spec.u_threshold
        dest.l_threshold = spec.l_threshold
        if add:
            self.dests.insert(0, dest)
            self._by_key[spec.key] = dest
            try:
                self.scheduler.add_dest(self.dests, dest)
            except IpvsError:
                self.dests.pop(0)
                del self._by_key[spec.key]
                raise
        else:
            self.scheduler.upd_dest(self.dests, dest)

    def del_dest(self, key: tuple[int, int, int]) -> Dest:
        """``ip_vs_del_dest``: unlink a real server; it waits in the trash while referenced.

        Raises:
            IpvsError: no such real server (``-ENOENT``).
        """
        dest = self._by_key.pop(key, None)
        if dest is None:
            raise IpvsError(f"no real server {key} in {self.spec.key} (ENOENT)")
        index = next(i for i, d in enumerate(self.dests) if d is dest)
        del self.dests[index]
        dest.available = False
        self.scheduler.del_dest(self.dests, dest, index)
        if dest.refs > 0:
            self.trash[key] = dest
        return dest

    def release(self, dest: Dest) -> None:
        """Drop a trashed server once nothing references it (``ip_vs_dest_trash_expire``)."""
        if not dest.available and dest.refs == 0:
            self.trash.pop(dest.spec.key, None)

    def schedule(self, pkt: SchedInput) -> Dest | None:
        """The scheduler's choice for a new connection, or ``None``."""
        return self.scheduler.schedule(self.dests, self.spec.flags, pkt)

    def dest_spec(self, dest: Dest) -> DestSpec:
        """The configuration of a live server (its current weight and thresholds)."""
        return replace(dest.spec, weight=dest.weight)
