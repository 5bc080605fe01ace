"""Creating the socket-LB maps and programs in a :class:`~kproxy.kernel.bpf.BpfKernel`, linking
them to a cgroup, and closing everything (which detaches it).

The maps are created from :func:`kproxy.modes.ebpf.layout.map_spec` (Cilium's names, types and
sizes; ``max_entries`` may replace Cilium's default), the programs from :mod:`.sock`; every fd is
owned by the :class:`SockLB` and closed by :meth:`SockLB.close`, links first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from emulation.bpf import AttachType, MapSpec, MapType, ProgType
from kproxy.errors import KernelError
from kproxy.kernel.bpf import BpfKernel, ProgramSpec
from kproxy.model import IPFamily
from kproxy.modes.ebpf import layout
from kproxy.modes.ebpf.datapath.sock import FORWARD_HOOKS, REVERSE_HOOKS, SOCK_MAPS, sock_program
from kproxy.modes.ebpf.render import MapOp, OpKind

__all__ = ["SockLB", "kernel_spec"]

_NAMES = {
    AttachType.CGROUP_INET4_CONNECT: "sock4_connect", AttachType.CGROUP_UDP4_SENDMSG: "sock4_sendmsg",
    AttachType.CGROUP_UDP4_RECVMSG: "sock4_recvmsg",
    AttachType.CGROUP_INET4_GETPEERNAME: "sock4_getpeer",
    AttachType.CGROUP_INET6_CONNECT: "sock6_connect", AttachType.CGROUP_UDP6_SENDMSG: "sock6_sendmsg",
    AttachType.CGROUP_UDP6_RECVMSG: "sock6_recvmsg",
    AttachType.CGROUP_INET6_GETPEERNAME: "sock6_getpeer",
}


def kernel_spec(spec: layout.MapSpec, *, max_entries: int | None = None) -> MapSpec:
    """The ``BPF_MAP_CREATE`` spec of a layout map (``max_entries`` replacing Cilium's default,
    ``--bpf-lb-map-max``, when given)."""
    inner = kernel_spec(spec.inner) if spec.inner is not None else None
    return MapSpec(type=MapType(int(spec.type)), key_size=spec.key_size, value_size=spec.value_size,
                   max_entries=max_entries or spec.max_entries,
                   flags=spec.flags, name=spec.kernel_name, inner=inner)


@dataclass(slots=True)
class SockLB:
    """The socket-LB maps and programs of the families given, in one kernel.

    Attributes:
        kernel: where they live.
        maps: ``(family, asm map name)`` -> fd; ``affinity_match`` is shared by both families.
        programs: hook -> program fd; links: hook -> link fd (after :meth:`attach`).
    """

    kernel: BpfKernel
    maps: dict[tuple[IPFamily, str], int] = field(default_factory=dict)
    programs: dict[AttachType, int] = field(default_factory=dict)
    links: dict[AttachType, int] = field(default_factory=dict)

    @classmethod
    def load(cls, kernel: BpfKernel, families: tuple[IPFamily, ...] = (IPFamily.IPv4, IPFamily.IPv6),
             *, max_entries: int | None = None) -> SockLB:
        """Create the maps and load the programs (the kernel's verifier checks each).

        Raises:
            KernelError: a map or program was refused (the verifier's log in the message);
                whatever was created is closed again.
        """
        lb = cls(kernel)
        try:
            match = kernel.create_map(kernel_spec(layout.map_spec("affinity_match", IPFamily.IPv4),
                                                  max_entries=max_entries))
            for family in families:
                lb.maps[(family, "affinity_match")] = match
                for name, kind in SOCK_MAPS.items():
                    if name != "affinity_match":
                        spec = kernel_spec(layout.map_spec(kind, family), max_entries=max_entries)
                        lb.maps[(family, name)] = kernel.create_map(spec)
            # IPv6 hooks translate ::ffff:a.b.c.d through the IPv4 maps when both are here
            v4_in_v6 = IPFamily.IPv4 in families and IPFamily.IPv6 in families
            for family in families:
                fds = {name: lb.maps[(family, name)] for name in SOCK_MAPS}
                if family is IPFamily.IPv6 and v4_in_v6:
                    fds.update({name + "4": lb.maps[(IPFamily.IPv4, name)] for name in SOCK_MAPS})
                for hook in FORWARD_HOOKS[family] + REVERSE_HOOKS[family]:
                    code = sock_program(hook, v4_in_v6=v4_in_v6 and family is IPFamily.IPv6).assemble(fds)
                    lb.programs[hook] = kernel.load_program(ProgramSpec(
                        type=ProgType.CGROUP_SOCK_ADDR, attach=hook, code=code, name=_NAMES[hook]))
        except KernelError:
            lb.close()
            raise
        return lb

    def by_cilium_name(self) -> dict[str, int]:
        """Cilium's map name (``cilium_lb4_services_v2`` ...) -> fd, for the maps loaded here."""
        out: dict[str, int] = {}
        for (family, name), fd in self.maps.items():
            out[layout.map_spec(SOCK_MAPS[name], family).name] = fd
        return out

    def fill(self, entries: Mapping[str, Mapping[bytes, bytes]], *, batch: int = 8192) -> int:
        """Write a full rendering (:meth:`kproxy.modes.ebpf.render.EbpfMaps.entries`) into the
        maps socket-LB reads, backends first; the other maps' entries are not socket-LB's.

        Returns:
            The number of syscalls made.

        Raises:
            KernelError: an entry was refused.
        """
        fds = self.by_cilium_name()
        calls = 0
        for name in sorted(entries, key=lambda n: "backends" not in n):
            if name in fds:
                items = list(entries[name].items())
                for i in range(0, len(items), batch):
                    calls += self.kernel.update_batch(fds[name], items[i:i + batch])
        return calls

    def apply(self, ops: Iterable[MapOp]) -> int:
        """Apply a partial sync's operations (:meth:`kproxy.modes.ebpf.render.MapState.sync`),
        in their order, to the maps loaded here; a delete of an absent key is fine.

        Returns:
            The number of map operations made.

        Raises:
            KernelError: an update was refused.
        """
        fds = self.by_cilium_name()
        done = 0
        for op in ops:
            fd = fds.get(op.map)
            if fd is None:
                continue
            if op.kind is OpKind.UPDATE:
                assert op.value is not None
                self.kernel.update(fd, op.key, op.value)
            else:
                self.kernel.delete(fd, op.key)
            done += 1
        return done

    def fd(self, family: IPFamily, name: str) -> int:
        """The fd of map ``name`` (``services``, ``backends``, ...) of ``family``."""
        return self.maps[(family, name)]

    def attach(self, cgroup: str) -> None:
        """Link every program to ``cgroup`` (a cgroup v2 folder).

        Raises:
            KernelError: a link was refused; the links made are closed again.
        """
        try:
            for hook, prog in self.programs.items():
                self.links[hook] = self.kernel.attach_cgroup(prog, cgroup, hook)
        except KernelError:
            self.detach()
            raise

    def detach(self) -> None:
        """Close every link (the programs stop running at once)."""
        for fd in self.links.values():
            self.kernel.close(fd)
        self.links.clear()

    def close(self) -> None:
        """Close links, programs and maps, in that order."""
        self.detach()
        for fd in self.programs.values():
            self.kernel.close(fd)
        self.programs.clear()
        for fd in sorted(set(self.maps.values()), reverse=True):
            self.kernel.close(fd)
        self.maps.clear()
