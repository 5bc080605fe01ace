"""Running a mode: a source, the sync engine, the mode's consumer and observability, until stopped.

- :mod:`kproxy.daemon.engine`: the instrumented engine and the run loop every mode shares;
- :mod:`kproxy.daemon.userspace`: the userspace data plane (``kproxy run --proxy-mode userspace``)
  and :func:`running_userspace_proxy` for harnesses;
- :mod:`kproxy.daemon.kernel`: the kernel modes (iptables, ipvs) against an emulated or the
  real kernel.
"""

from kproxy.daemon.engine import build_engine, follow_node, run_until_stopped
from kproxy.daemon.userspace import RunningProxy, UserspaceOptions, running_userspace_proxy, serve

__all__ = [
    "RunningProxy", "UserspaceOptions", "build_engine", "follow_node", "run_until_stopped",
    "running_userspace_proxy", "serve",
]
