"""The narrow kernel interfaces the kernel modes program through, emulated (rootless) or Linux (root).

- :class:`NetfilterKernel` (``iptables``/``ip6tables``): :class:`EmulatedNetfilter` over an
  :class:`emulation.netfilter.Netns`, :class:`LinuxNetfilter` running the tools as root.
- :class:`IpvsKernel` (IPVS, its ipsets, ``kube-ipvs0``): :class:`EmulatedIpvs` over an
  :class:`IpvsNode`, :class:`LinuxIpvs` running ``ipvsadm``, ``ipset`` and ``ip`` as root.
- :class:`NftablesKernel` (the ``kube-proxy`` nftables table): :class:`EmulatedNftables` over an
  :class:`emulation.nftables.Netns`, :class:`LinuxNftables` running ``nft -f`` as root.
- :class:`BpfKernel` (the ``bpf()`` syscall: maps, programs, cgroup and tcx links, test runs):
  :class:`EmulatedBpf` over the BPF machine of :mod:`emulation.bpf`, :class:`LinuxBpf` through
  ctypes as root.
- :func:`trace_node`: the one-interface node model used when only the node IPs are known.

What to call, in which order, is the modes' business (:mod:`kproxy.modes`), never a kernel's.
"""

from kproxy.kernel.bpf import BpfKernel, EmulatedBpf, ProgramSpec, TestRun
from kproxy.kernel.conntrack import ConntrackFilter, stale_conntrack_filters
from kproxy.kernel.emulated import EmulatedNetfilter, run_now
from kproxy.kernel.emulated_nftables import EmulatedNftables, emulated_nftables
from kproxy.kernel.ipvs import EmulatedIpvs, IpvsKernel, RealServerInfo, VirtualServerInfo
from kproxy.kernel.ipvs_node import IpvsNode
from kproxy.kernel.linux import LinuxNetfilter
from kproxy.kernel.linux_bpf import LinuxBpf
from kproxy.kernel.linux_ipvs import LinuxIpvs
from kproxy.kernel.netfilter import NetfilterKernel
from kproxy.kernel.nftables import LinuxNftables, NftablesKernel
from kproxy.kernel.node import EXTERNAL_INTERFACE, PLACEHOLDER_IPS, trace_node

__all__ = [
    "EXTERNAL_INTERFACE",
    "PLACEHOLDER_IPS",
    "BpfKernel",
    "ConntrackFilter",
    "EmulatedBpf",
    "EmulatedIpvs",
    "EmulatedNetfilter",
    "EmulatedNftables",
    "IpvsKernel",
    "IpvsNode",
    "LinuxBpf",
    "LinuxIpvs",
    "LinuxNetfilter",
    "LinuxNftables",
    "NetfilterKernel",
    "NftablesKernel",
    "ProgramSpec",
    "RealServerInfo",
    "TestRun",
    "VirtualServerInfo",
    "emulated_nftables",
    "run_now",
    "stale_conntrack_filters",
    "trace_node",
]
