"""Filling the socket-LB maps with Services as Cilium's agent lays them out (layout.py's bytes),
for the datapath tests on the emulated and the Linux kernel alike."""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.kernel.bpf import BpfKernel
from kproxy.model import IPFamily
from kproxy.modes.ebpf.datapath import SockLB
from kproxy.modes.ebpf.layout import (
    AffinityMatchKey,
    Backend,
    Scope,
    ServiceFlag,
    ServiceFlag2,
    ServiceKey,
    ServiceValue,
    backend_key,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Svc:
    """One frontend with its backends (all active), as the tests need it."""

    vip: str
    port: int
    rev_nat_index: int
    backends: tuple[tuple[int, str, int], ...] = ()  # (backend id, address, port)
    proto: int = 6
    flags: ServiceFlag = ServiceFlag.NONE
    flags2: ServiceFlag2 = ServiceFlag2.NONE
    affinity_timeout_s: int = 0
    scope: int = 0

    @property
    def family(self) -> IPFamily:
        """The frontend's family."""
        return IPFamily.IPv6 if ":" in self.vip else IPFamily.IPv4


def put(k: BpfKernel, lb: SockLB, svc: Svc) -> None:
    """Write the master entry, the slots, the backends and (with affinity) the match entries."""
    fam = svc.family
    services, backends = lb.fd(fam, "services"), lb.fd(fam, "backends")
    key = ServiceKey(address=svc.vip, dport=svc.port, proto=svc.proto, scope=Scope(svc.scope))
    master = ServiceValue.master_entry(count=len(svc.backends), qcount=0,
                                       rev_nat_index=svc.rev_nat_index, flags=svc.flags,
                                       flags2=svc.flags2, affinity_timeout_s=svc.affinity_timeout_s)
    k.update(services, key.pack(), master.pack())
    for slot, (bid, ip, port) in enumerate(svc.backends, start=1):
        slot_key = ServiceKey(address=svc.vip, dport=svc.port, proto=svc.proto, scope=Scope(svc.scope),
                              backend_slot=slot)
        k.update(services, slot_key.pack(),
                 ServiceValue(backend_id=bid, rev_nat_index=svc.rev_nat_index).pack())
        k.update(backends, backend_key(bid), Backend(address=ip, port=port, proto=svc.proto).pack())
        if svc.flags & ServiceFlag.AFFINITY:
            k.update(lb.fd(fam, "affinity_match"),
                     AffinityMatchKey(backend_id=bid, rev_nat_id=svc.rev_nat_index).pack(), b"\x01")


def remove(k: BpfKernel, lb: SockLB, svc: Svc) -> None:
    """Delete the frontend's master entry and slots."""
    services = lb.fd(svc.family, "services")
    for slot in range(len(svc.backends) + 1):
        k.delete(services, ServiceKey(address=svc.vip, dport=svc.port, proto=svc.proto,
                                      backend_slot=slot).pack())
