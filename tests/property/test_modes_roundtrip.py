"""Property: every rendered artefact survives a round trip through its own emulator.

The iptables mode's restore text, loaded into the emulator and printed back as ``iptables-save``
would, is a fixpoint (parse what we render, render what we parse: the same canonical text), keeps
every rule of the render in order, and kube-proxy's canonical ordering of it is idempotent.
Example counts are for the ``ci`` profile; ``HYPOTHESIS_PROFILE=thorough`` multiplies them by 20.
"""

from __future__ import annotations

import os

from hypothesis import given, settings

from emulation.netfilter import Ruleset, apply_restore, load, save
from kproxy.model import IPFamily
from kproxy.modes.iptables import render_full, sort_restore_text
from kproxy.testing import Cluster, clusters
from kproxy.testing.modes import iptables_config

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"


def _specs(ruleset: Ruleset) -> dict[tuple[str, str], list[str]]:
    return {(t, c): [r.spec() for r in chain.rules]
            for t, table in ruleset.tables.items() for c, chain in table.chains.items()}


@settings(max_examples=400 if THOROUGH else 60, deadline=None, derandomize=not THOROUGH)
@given(clusters(max_services=4))
def test_rendered_rules_round_trip_through_the_emulator(cluster: Cluster) -> None:
    """render -> restore -> save -> load -> save is a fixpoint that keeps every rendered rule in order."""
    for family in (IPFamily.IPv4, IPFamily.IPv6):
        version = 6 if family is IPFamily.IPv6 else 4
        text = render_full(cluster.snapshot, iptables_config(cluster, family))
        restored = apply_restore(Ruleset(version), text)
        saved = save(restored)
        reloaded = load(saved, version=version, strict=True)
        assert save(reloaded) == saved
        assert _specs(reloaded) == _specs(restored)
        assert sort_restore_text(sort_restore_text(text)) == sort_restore_text(text)
