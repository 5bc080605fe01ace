"""The eBPF mode's datapath: BPF programs kproxy assembles itself (no compiler).

:mod:`.sock` has the socket-LB programs for the cgroup hooks (Cilium's ``bpf_sock.c`` logic
over the maps of :mod:`kproxy.modes.ebpf.layout`); :mod:`.loader` creates the maps, loads and
links the programs in a :class:`~kproxy.kernel.bpf.BpfKernel`, emulated or Linux;
:mod:`.predict` tells what a connect from the node does, on the BPF machine.
"""

from kproxy.modes.ebpf.datapath.loader import SockLB, kernel_spec
from kproxy.modes.ebpf.datapath.predict import (
    ConnectOutcome,
    ConnectVerdict,
    emulated_socklb,
    predict_connect,
)
from kproxy.modes.ebpf.datapath.sock import FORWARD_HOOKS, REVERSE_HOOKS, sock_program

__all__ = [
    "FORWARD_HOOKS",
    "REVERSE_HOOKS",
    "ConnectOutcome",
    "ConnectVerdict",
    "SockLB",
    "emulated_socklb",
    "kernel_spec",
    "predict_connect",
    "sock_program",
]
