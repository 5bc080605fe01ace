"""Shared pytest configuration: real-kernel tests skip without root, and fail instead under CI.

Tests marked ``kernel`` need root, ``ip netns`` and the tools they name. Where the machine
cannot run them they skip, unless ``KPROXY_REQUIRE_KERNEL=1`` (set by ``.ci/run``), where a
skip would hide a regression, so the test fails instead.
"""

from __future__ import annotations

import os
import shutil

import pytest
import structlog


def require_kernel(*tools: str) -> None:
    """Skip (or, with KPROXY_REQUIRE_KERNEL=1, fail) unless root with ``ip`` and ``tools``."""
    missing = [t for t in ("ip", *tools) if shutil.which(t) is None]
    reason = ""
    if os.geteuid() != 0:
        reason = "needs root"
    elif missing:
        reason = f"needs {', '.join(missing)} on PATH"
    if not reason:
        return
    if os.environ.get("KPROXY_REQUIRE_KERNEL") == "1":
        pytest.fail(f"real-kernel test cannot run ({reason}) but KPROXY_REQUIRE_KERNEL=1")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _reset_structlog() -> object:
    """Undo any structlog configuration a test made (the CLI binds it to captured stderr)."""
    yield
    structlog.reset_defaults()


# -- Hypothesis profiles (the rule-equivalence suite, tests/property/test_equivalence*.py) -------
# ``ci`` (the default) keeps every property bounded and deterministic in time; ``thorough`` is for
# local runs (HYPOTHESIS_PROFILE=thorough): those properties read the variable to scale their
# example counts, since settings applied as decorators win over a profile.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", deadline=None, print_blob=True)
_hypothesis_settings.register_profile("thorough", deadline=None, print_blob=True)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
