"""Keep the cyclic garbage collector from stalling every thread while a large change is built.

A 4,000-Service manifest becomes about a million Python objects. CPython's cyclic collector
runs a full (generation 2) collection each time the objects that survived earlier ones grow by
a quarter, and a full collection walks every tracked object with the GIL held, in whichever
thread triggered it: the event loop serving traffic stops for 100 to 300 ms each time (the
benchmark ``tests/benchmarks/bench_manifest_load.py`` shows it). Work that builds a large
change therefore runs inside :func:`collector_paused`: the collector is off while it runs, and
what survived is then moved to the permanent generation (``gc.freeze``, as the CPython
documentation recommends for long-lived state), so later collections do not walk it again.
Memory is still freed by reference counting; only reference cycles created during a paused
section and dead later are not reclaimed, and kproxy's frozen values form none.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PAUSED_SWITCH_INTERVAL_S", "collector_paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False
_switch_s = 0.005
#: While a large change is built in a worker thread, the event loop's thread waits at most this
#: long for the GIL (CPython's default is 5 ms, paid on every loop wake-up during the build).
PAUSED_SWITCH_INTERVAL_S = 0.0005


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector for the block (nesting and threads allowed), then freeze survivors.

    The GIL switch interval is also shortened to :data:`PAUSED_SWITCH_INTERVAL_S` meanwhile, so
    the event loop's thread gets the interpreter back quickly from the worker thread.
    """
    global _depth, _was_enabled, _switch_s
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
            _switch_s = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_s, PAUSED_SWITCH_INTERVAL_S))
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                sys.setswitchinterval(_switch_s)
                gc.freeze()
                if _was_enabled:
                    gc.enable()
