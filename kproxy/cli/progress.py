"""Progress bars for long commands, on a terminal only (tqdm).

``kproxy render`` of 20,000 Services reads for tens of seconds and ``kproxy verify --examples
5000`` checks for more than a minute; on a terminal they show where they are. A bar appears only
when standard error is a terminal, only after the first second (quick runs print nothing), and is
erased when done, so output that is piped, redirected or logged as JSON never holds one.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

from tqdm import tqdm

__all__ = ["PROGRESS_DELAY_S", "document_progress", "progress_wanted", "step_progress"]

#: Seconds before a bar appears.
PROGRESS_DELAY_S = 1.0


def progress_wanted(log_format: str | None = None) -> bool:
    """Show bars: standard error is a terminal, logs are not JSON, and ``TERM`` is not ``dumb``."""
    return sys.stderr.isatty() and log_format != "json" and os.environ.get("TERM") != "dumb"


@contextlib.contextmanager
def step_progress(what: str, total: int, *, unit: str, enabled: bool) -> Iterator[Callable[[], None]]:
    """A bar of ``total`` steps; yields the function that counts one step (a no-op when not ``enabled``)."""
    if not enabled:
        yield lambda: None
        return
    with tqdm(total=total, desc=what, unit=unit, file=sys.stderr, leave=False, delay=PROGRESS_DELAY_S,
              mininterval=0.25, dynamic_ncols=True) as bar:
        def one() -> None:
            bar.update(1)

        yield one


@contextlib.contextmanager
def document_progress(*, enabled: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """A bar over the documents of the manifests being read, for ``read_manifests(progress=...)``;
    None when not ``enabled``."""
    if not enabled:
        yield None
        return
    with tqdm(desc="reading manifests", unit=" documents", file=sys.stderr, leave=False,
              delay=PROGRESS_DELAY_S, mininterval=0.25, dynamic_ncols=True) as bar:
        current = [""]

        def report(path: str, done: int, total: int) -> None:
            if path != current[0]:
                current[0] = path
                bar.reset(total=total)
                bar.set_postfix_str(os.path.basename(path), refresh=False)
            if total != bar.total:
                bar.total = total
            bar.update(done - bar.n)

        yield report
