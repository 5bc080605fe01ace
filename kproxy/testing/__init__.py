"""Prove that every proxy mode forwards a cluster the same way, and test your own clusters with it.

- :mod:`kproxy.testing.strategies`: Hypothesis strategies (:func:`services`,
  :func:`endpoint_slices`, :func:`clusters`, :func:`packets`) biased toward what breaks proxies.
- :class:`Cluster` (API dicts parsed once into the model and a Snapshot), :class:`NodeSpec`
  (the node under test) and :class:`Packet` (a connection's first packet, with its origin).
- :class:`Outcome`: one answer type for every mode (verdict, endpoints with probabilities,
  masquerade, the mode's trace); :mod:`kproxy.testing.modes` holds the mode adapters.
- :func:`assert_equivalent` / :func:`compare`: do the modes agree, the documented
  :data:`KNOWN_DIFFERENCES` excepted?
- :class:`InProcessCluster`: a running in-process cluster (memory source, userspace proxy,
  loopback identity backends), also given to pytest tests by the ``kproxy_cluster`` fixture of
  the plugin (:mod:`kproxy.testing.plugin`, registered through the ``pytest11`` entry point).
- :class:`ClusterServer`: an API server for harnesses (what ``kproxy cluster serve`` runs: list,
  watch, discovery, ``pods/portforward``, fault injection), and :func:`port_forward`, kproxy's
  port-forward client as an async context manager.

Example::

    from hypothesis import given, strategies as st
    from kproxy.testing import assert_equivalent, clusters, packets

    @given(st.data())
    def test_modes_agree(data):
        cluster = data.draw(clusters())
        assert_equivalent(cluster, data.draw(packets(cluster)))

The strategies need Hypothesis, which the ``testing`` extra brings
(``pip install 'kproxy[testing]'``); everything else here works without it.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kproxy.cluster import ClusterServer
    from kproxy.portforward.client import port_forward
    from kproxy.testing.cluster import Cluster, NodeSpec, Origin, Packet, Target, emulated_node
    from kproxy.testing.differences import (
        AFFINITY_TIMEOUT_BOUNDARY,
        KNOWN_DIFFERENCES,
        KnownDifference,
        affinity_holds,
    )
    from kproxy.testing.equivalence import Comparison, NotEquivalent, assert_equivalent, compare
    from kproxy.testing.harness import InProcessCluster, in_process_cluster
    from kproxy.testing.modes import (
        DEFAULT_MODES,
        ModeAdapter,
        available_modes,
        get_mode,
        register_mode,
    )
    from kproxy.testing.outcome import EndpointShares, Outcome, Verdict
    from kproxy.testing.strategies import clusters, endpoint_slices, packets, services

#: Where each public name lives, imported on first use: the pytest plugin (loaded in every
#: pytest session of a project that installed kproxy) imports the harness without Hypothesis,
#: which only :mod:`kproxy.testing.strategies` needs (``pip install 'kproxy[testing]'``).
_EXPORTS: dict[str, str] = {
    "AFFINITY_TIMEOUT_BOUNDARY": "kproxy.testing.differences",
    "Cluster": "kproxy.testing.cluster",
    "ClusterServer": "kproxy.cluster",
    "Comparison": "kproxy.testing.equivalence",
    "DEFAULT_MODES": "kproxy.testing.modes",
    "EndpointShares": "kproxy.testing.outcome",
    "InProcessCluster": "kproxy.testing.harness",
    "KNOWN_DIFFERENCES": "kproxy.testing.differences",
    "KnownDifference": "kproxy.testing.differences",
    "ModeAdapter": "kproxy.testing.modes",
    "NodeSpec": "kproxy.testing.cluster",
    "NotEquivalent": "kproxy.testing.equivalence",
    "Origin": "kproxy.testing.cluster",
    "Outcome": "kproxy.testing.outcome",
    "Packet": "kproxy.testing.cluster",
    "Target": "kproxy.testing.cluster",
    "Verdict": "kproxy.testing.outcome",
    "affinity_holds": "kproxy.testing.differences",
    "assert_equivalent": "kproxy.testing.equivalence",
    "available_modes": "kproxy.testing.modes",
    "clusters": "kproxy.testing.strategies",
    "compare": "kproxy.testing.equivalence",
    "emulated_node": "kproxy.testing.cluster",
    "endpoint_slices": "kproxy.testing.strategies",
    "get_mode": "kproxy.testing.modes",
    "in_process_cluster": "kproxy.testing.harness",
    "packets": "kproxy.testing.strategies",
    "port_forward": "kproxy.portforward.client",
    "register_mode": "kproxy.testing.modes",
    "services": "kproxy.testing.strategies",
}


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kproxy.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "AFFINITY_TIMEOUT_BOUNDARY",
    "DEFAULT_MODES",
    "KNOWN_DIFFERENCES",
    "Cluster",
    "ClusterServer",
    "Comparison",
    "EndpointShares",
    "InProcessCluster",
    "KnownDifference",
    "ModeAdapter",
    "NodeSpec",
    "NotEquivalent",
    "Origin",
    "Outcome",
    "Packet",
    "Target",
    "Verdict",
    "affinity_holds",
    "assert_equivalent",
    "available_modes",
    "clusters",
    "compare",
    "emulated_node",
    "endpoint_slices",
    "get_mode",
    "in_process_cluster",
    "packets",
    "port_forward",
    "register_mode",
    "services",
]
