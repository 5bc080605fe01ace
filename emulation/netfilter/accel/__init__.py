"""The accelerator: compiled, indexed chains and the flow cache, proven equal to the plain walk.

Nothing here changes what a packet does; it changes how fast that is found. The reference
semantics are the plain walk (:mod:`emulation.netfilter.traverse`) along the hooks
(:mod:`emulation.netfilter.path`); the equivalence properties in ``tests/emulation`` hold the
accelerator to them. What it derives from rules and chains it keeps in side tables of its own
(:class:`Accelerator`), never inside the immutable values.

- :mod:`.deps`: what each rule reads of a packet;
- :mod:`.compile`: rules compiled to closures, and the index of a long chain;
- :mod:`.walk`: the side tables and the indexed walk;
- :mod:`.flowcache`, :mod:`.recorder`, :mod:`.replay`: the megaflow cache of whole paths.
"""

from emulation.netfilter.accel.deps import NOTHING, Deps, match_deps, rule_deps
from emulation.netfilter.accel.flowcache import FlowCache, FlowSet, Segment, Summary
from emulation.netfilter.accel.recorder import Recorder
from emulation.netfilter.accel.replay import FlowFront
from emulation.netfilter.accel.walk import Accelerator

__all__ = [
    "NOTHING",
    "Accelerator",
    "Deps",
    "FlowCache",
    "FlowFront",
    "FlowSet",
    "Recorder",
    "Segment",
    "Summary",
    "match_deps",
    "rule_deps",
]
