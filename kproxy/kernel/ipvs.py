"""The narrow IPVS interface the ipvs mode programs through, and its emulated implementation.

As kube-proxy's ``utilipvs.Interface`` (pkg/proxy/ipvs/util/ipvs.go) is narrow, so is
:class:`IpvsKernel`: read, add, update and delete virtual servers and their real servers; beside
it the mode needs the ipsets (``ipset restore``), the ``kube-ipvs0`` addresses and the netfilter
tables (a :class:`~kproxy.kernel.netfilter.NetfilterKernel`), which :class:`IpvsKernel` also
carries. Values are the IPVS model's own (:class:`emulation.ipvs.ServiceSpec`,
:class:`emulation.ipvs.DestSpec`), which format as ``ipvsadm`` prints them.

Synchronous, as kube-proxy's netlink calls are. :class:`EmulatedIpvs` programs an
:class:`~kproxy.kernel.ipvs_node.IpvsNode` (time is the node's clock);
:class:`~kproxy.kernel.linux_ipvs.LinuxIpvs` runs ``ipvsadm``, ``ipset`` and ``ip`` as root.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from emulation.errors import EmulationError
from emulation.ipset import load_save
from emulation.ipvs import DestSpec, IpvsError, ServiceKey, ServiceSpec
from kproxy.errors import KernelError
from kproxy.kernel.emulated import EmulatedNetfilter
from kproxy.kernel.ipvs_node import IpvsNode
from kproxy.kernel.netfilter import NetfilterKernel
from kproxy.model.names import IPFamily

__all__ = ["EmulatedIpvs", "IpvsKernel", "RealServerInfo", "VirtualServerInfo"]

DestKey = tuple[int, int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class RealServerInfo:
    """A real server as ``ipvsadm -Ln --stats`` shows it: its ``spec`` (weight included) and its
    ``active_conns`` and ``inactive_conns`` counts."""

    spec: DestSpec
    active_conns: int = 0
    inactive_conns: int = 0

    @property
    def key(self) -> DestKey:
        """``(version, address, port)``."""
        return self.spec.key


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualServerInfo:
    """A virtual server's ``spec`` and its ``real_servers`` in the kernel's list order."""

    spec: ServiceSpec
    real_servers: tuple[RealServerInfo, ...] = ()

    def find(self, key: DestKey) -> RealServerInfo | None:
        """The real server of ``key``, or None."""
        return next((r for r in self.real_servers if r.key == key), None)


@runtime_checkable
class IpvsKernel(Protocol):
    """One family's IPVS table with its ipsets, ``kube-ipvs0`` and netfilter tables.

    Attributes:
        family: the IP family.
        netfilter: the family's netfilter tables.
    """

    family: IPFamily

    @property
    def netfilter(self) -> NetfilterKernel:
        """The family's netfilter tables."""
        ...

    def virtual_servers(self) -> tuple[VirtualServerInfo, ...]:
        """Every virtual server with its real servers (``GetVirtualServers`` + ``GetRealServers``)."""
        ...

    def virtual_server(self, key: ServiceKey) -> VirtualServerInfo | None:
        """The virtual server of ``key``, or None when there is none."""
        ...

    def add_virtual_server(self, spec: ServiceSpec) -> None:
        """``AddVirtualServer``. Raises: KernelError: refused (it exists, a bad scheduler)."""
        ...

    def update_virtual_server(self, spec: ServiceSpec) -> None:
        """``UpdateVirtualServer``. Raises: KernelError: refused."""
        ...

    def delete_virtual_server(self, key: ServiceKey) -> None:
        """``DeleteVirtualServer``. Raises: KernelError: refused."""
        ...

    def add_real_server(self, key: ServiceKey, spec: DestSpec) -> None:
        """``AddRealServer``. Raises: KernelError: refused."""
        ...

    def update_real_server(self, key: ServiceKey, spec: DestSpec) -> None:
        """``UpdateRealServer`` (a weight change). Raises: KernelError: refused."""
        ...

    def delete_real_server(self, key: ServiceKey, dest: DestKey) -> None:
        """``DeleteRealServer``. Raises: KernelError: refused."""
        ...

    def restore_ipsets(self, text: str) -> None:
        """``ipset restore -exist`` of ``text``. Raises: KernelError: refused; nothing changed."""
        ...

    def bind_addresses(self, addresses: tuple[str, ...]) -> None:
        """Make ``addresses`` exactly the addresses of ``kube-ipvs0``. Raises: KernelError: refused."""
        ...


def _refused(what: str, err: Exception) -> KernelError:
    return KernelError(f"the IPVS table refused {what}: {err}")


class EmulatedIpvs:
    """:class:`IpvsKernel` over an emulated :class:`~kproxy.kernel.ipvs_node.IpvsNode`.

    Args:
        node: the emulated node; its ruleset's version gives the family.
    """

    def __init__(self, node: IpvsNode) -> None:
        self.node = node
        self.family = IPFamily.IPv6 if node.netns.ruleset.version == 6 else IPFamily.IPv4
        self.netfilter: EmulatedNetfilter = EmulatedNetfilter(node.netns, self.family)

    def _now(self) -> float:
        now = self.node.clock.now()
        self.node.ipvs.advance(now)  # the kernel's connection timers fire on their own time
        return now

    def virtual_servers(self) -> tuple[VirtualServerInfo, ...]:
        """See :class:`IpvsKernel`."""
        self._now()
        return tuple(self._info(svc.spec.key) for svc in self.node.ipvs.services())

    def _info(self, key: ServiceKey) -> VirtualServerInfo:
        svc = self.node.ipvs.service(key)
        return VirtualServerInfo(spec=svc.spec, real_servers=tuple(
            RealServerInfo(spec=svc.dest_spec(d), active_conns=d.activeconns, inactive_conns=d.inactconns)
            for d in svc.dests))

    def virtual_server(self, key: ServiceKey) -> VirtualServerInfo | None:
        """See :class:`IpvsKernel`."""
        self._now()
        try:
            return self._info(key)
        except IpvsError:
            return None

    def add_virtual_server(self, spec: ServiceSpec) -> None:
        """See :class:`IpvsKernel`. Raises: KernelError: refused."""
        try:
            self.node.ipvs.add_service(spec)
        except IpvsError as err:
            raise _refused(f"adding {spec.key}", err) from err

    def update_virtual_server(self, spec: ServiceSpec) -> None:
        """See :class:`IpvsKernel`. Raises: KernelError: refused."""
        try:
            self.node.ipvs.edit_service(spec)
        except IpvsError as err:
            raise _refused(f"editing {spec.key}", err) from err

    def delete_virtual_server(self, key: ServiceKey) -> None:
        """See :class:`IpvsKernel`. Raises: KernelError: refused."""
        try:
            self.node.ipvs.del_service(key, self._now())
        except IpvsError as err:
            raise _refused(f"deleting {key}", err) from err

    def add_real_server(self, key: ServiceKey, spec: DestSpec) -> None:
        """See :class:`IpvsKernel`. Raises: KernelError: refused."""
        try:
            self.node.ipvs.add_dest(key, spec)
        except IpvsError as err:
            raise _refused(f"adding a real server to {key}", err) from err

    def update_real_server(self, key: ServiceKey, spec: DestSpec) -> None:
        """See :class:`IpvsKernel`. Raises: KernelError: refused."""
        try:
            self.node.ipvs.edit_dest(key, spec)
        except IpvsError as err:
            raise _refused(f"editing a real server of {key}", err) from err

    def delete_real_server(self, key: ServiceKey, dest: DestKey) -> None:
        """See :class:`IpvsKernel`. Raises: KernelError: refused."""
        try:
            self.node.ipvs.del_dest(key, dest, self._now())
        except IpvsError as err:
            raise _refused(f"deleting a real server of {key}", err) from err

    def restore_ipsets(self, text: str) -> None:
        """See :class:`IpvsKernel`. Raises: KernelError: refused; nothing changed."""
        try:
            load_save(text, self.node.ipsets, exist=True)
        except EmulationError as err:
            raise KernelError(f"ipset restore of the ipvs mode's sets failed: {err}") from err

    def bind_addresses(self, addresses: tuple[str, ...]) -> None:
        """See :class:`IpvsKernel`."""
        self.node.bind(addresses)
