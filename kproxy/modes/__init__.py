"""The modes, one package each: they turn a :class:`~kproxy.model.Snapshot` into one data plane.

Each mode has a pure ``render(snapshot, config)`` (snapshot in, text or state out) and a
consumer the sync engine calls with every snapshot, which applies it: the userspace data plane
to its own sockets, the kernel modes through a narrow kernel interface
(:mod:`kproxy.kernel`). :data:`MODES` is the one place a mode is registered: ``kproxy run``,
``render`` and ``trace`` take their ``--proxy-mode`` choices from it.

- :mod:`kproxy.modes.userspace`: a listener per service port, round robin with ClientIP affinity;
- :mod:`kproxy.modes.iptables`: kube-proxy's iptables proxier (``pkg/proxy/iptables``);
- :mod:`kproxy.modes.nftables`: kube-proxy's nftables proxier (``pkg/proxy/nftables``);
- :mod:`kproxy.modes.ipvs`: kube-proxy's ipvs proxier (``pkg/proxy/ipvs``);
- :mod:`kproxy.modes.ebpf`: Cilium's eBPF service load balancing (``bpf/lib/lb.h``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODES", "ModeInfo", "kernel_modes", "rendered_modes", "run_modes", "traced_modes"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeInfo:
    """What one mode is and what the commands can do with it.

    Attributes:
        name: the ``--proxy-mode`` value (kube-proxy's name where it has one).
        package: the mode's package under ``kproxy.modes``.
        kernel: it programs a kernel through :mod:`kproxy.kernel` (``--kernel emulated|linux``).
        renders: ``kproxy render`` prints its programme.
        summary: one line for ``--help``.
        runs: ``kproxy run`` runs it, and ``trace``/``verify`` follow packets through it (the
            nftables mode renders only, for now: its kernel model and consumer are not wired).
    """

    name: str
    package: str
    kernel: bool
    renders: bool
    summary: str
    runs: bool = True


#: Every mode, in the order ``--help`` lists them.
MODES: dict[str, ModeInfo] = {
    info.name: info for info in (
        ModeInfo(name="userspace", package="kproxy.modes.userspace", kernel=False, renders=False,
                 summary="serve every service port on loopback, rootless"),
        ModeInfo(name="iptables", package="kproxy.modes.iptables", kernel=True, renders=True,
                 summary="kube-proxy's iptables rules"),
        ModeInfo(name="nftables", package="kproxy.modes.nftables", kernel=True, renders=True,
                 summary="kube-proxy's nftables table (sets and verdict maps; render only)", runs=False),
        ModeInfo(name="ipvs", package="kproxy.modes.ipvs", kernel=True, renders=True,
                 summary="kube-proxy's IPVS virtual servers, ipsets and iptables rules"),
        ModeInfo(name="ebpf", package="kproxy.modes.ebpf", kernel=True, renders=True,
                 summary="Cilium's eBPF service maps (socket-LB and tc; render only)", runs=False),
    )
}


def kernel_modes() -> tuple[str, ...]:
    """The names of the modes that program a kernel."""
    return tuple(name for name, info in MODES.items() if info.kernel)


def rendered_modes() -> tuple[str, ...]:
    """The names of the modes ``kproxy render`` prints."""
    return tuple(name for name, info in MODES.items() if info.renders)


def run_modes() -> tuple[str, ...]:
    """The names of the modes ``kproxy run`` runs."""
    return tuple(name for name, info in MODES.items() if info.runs)


def traced_modes() -> tuple[str, ...]:
    """The names of the modes ``kproxy trace`` follows a packet through."""
    return tuple(name for name, info in MODES.items() if info.renders and info.runs)
