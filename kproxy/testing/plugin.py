"""The kproxy pytest plugin (entry point ``pytest11``: ``kproxy = "kproxy.testing.plugin"``).

Installed with kproxy, it gives every test suite:

- ``--kproxy-modes LIST``: the modes equivalence tests cover, comma-separated (default
  :data:`~kproxy.testing.modes.DEFAULT_MODES`; see :func:`~kproxy.testing.modes.available_modes`).
  An unknown, repeated or missing mode is one usage error at start-up (``--kproxy-modes: ...``).
- ``kproxy_modes`` (session fixture): that list, as a tuple of names, for
  :func:`~kproxy.testing.assert_equivalent` (session-scoped, so Hypothesis tests may use it).
- ``kproxy_cluster`` (async fixture, needs pytest-asyncio; mark the test ``@pytest.mark.asyncio``
  unless ``asyncio_mode = auto``, and set ``asyncio_default_fixture_loop_scope = function`` in
  the project's pytest configuration, or pytest-asyncio warns that it is unset): a running
  :class:`~kproxy.testing.InProcessCluster` (memory source, userspace proxy, helpers to start
  loopback identity backends and to add, scale and remove Services while the test runs; a port
  is addressed as ``ns/name``, ``ns/name:NUMBER`` or ``ns/name:NAME``, see
  :mod:`kproxy.testing.harness`)::

      @pytest.mark.asyncio
      async def test_scaling(kproxy_cluster):
          web = await kproxy_cluster.add_service("demo/web", (80,), replicas=2)
          assert await kproxy_cluster.request(web) in await kproxy_cluster.scale(web, 2)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from kproxy.errors import InvalidArgument
from kproxy.testing.harness import InProcessCluster, in_process_cluster
from kproxy.testing.modes import DEFAULT_MODES, available_modes, get_mode

__all__ = ["kproxy_cluster", "kproxy_modes", "parse_modes", "pytest_addoption", "pytest_configure"]


def parse_modes(text: str | None) -> tuple[str, ...]:
    """The mode names in ``text`` (comma-separated); None or blank gives the default modes.

    Raises:
        InvalidArgument: an unknown or repeated mode, or only commas (the message starts with
            ``--kproxy-modes:`` and lists the available modes).
    """
    if text is None or not text.strip():
        return DEFAULT_MODES
    available = ",".join(available_modes())
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise InvalidArgument(f"--kproxy-modes: expected mode names, comma-separated, got {text!r}; "
                              f"available: {available}")
    if len(set(names)) != len(names):
        raise InvalidArgument(f"--kproxy-modes: a mode is listed twice in {text!r}")
    for name in names:
        if name not in available_modes():
            raise InvalidArgument(f"--kproxy-modes: unknown mode {name!r}; available: {available}")
        get_mode(name)
    return names


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--kproxy-modes``."""
    group = parser.getgroup("kproxy", "kproxy rule-equivalence checks")
    group.addoption("--kproxy-modes", default=None, metavar="LIST",
                    help="modes the equivalence checks cover, comma-separated "
                         f"(default {','.join(DEFAULT_MODES)}; available: {','.join(available_modes())})")


def pytest_configure(config: pytest.Config) -> None:
    """Check ``--kproxy-modes`` once, at start-up.

    Raises:
        pytest.UsageError: a bad value (the message starts with ``--kproxy-modes:``).
    """
    try:
        parse_modes(config.getoption("--kproxy-modes"))
    except InvalidArgument as err:
        raise pytest.UsageError(str(err)) from None


@pytest.fixture(scope="session")
def kproxy_modes(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The modes chosen with ``--kproxy-modes`` (default: the default modes)."""
    return parse_modes(request.config.getoption("--kproxy-modes"))


try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - pytest-asyncio is in kproxy's test extra
    @pytest.fixture
    def kproxy_cluster() -> Any:
        """Needs pytest-asyncio (``pip install kproxy[test]``); skips without it."""
        pytest.skip("the kproxy_cluster fixture needs pytest-asyncio")
else:
    @pytest_asyncio.fixture
    async def kproxy_cluster() -> AsyncIterator[InProcessCluster]:  # type: ignore[misc]
        """A running in-process cluster (see the module docstring), closed after the test."""
        async with in_process_cluster() as cluster:
            yield cluster
