# ruff: noqa: E501  (cluster literals and test names are kept whole to stay readable)
"""The pytest plugin: the --kproxy-modes option and a running in-process cluster fixture."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import kproxy.testing
from kproxy.errors import InvalidArgument
from kproxy.testing import DEFAULT_MODES, InProcessCluster
from kproxy.testing.plugin import parse_modes


def test_parse_modes_defaults_and_validates() -> None:
    """No value gives the default modes; an unknown or repeated mode raises naming it."""
    assert parse_modes(None) == DEFAULT_MODES
    assert parse_modes("iptables, userspace") == ("iptables", "userspace")
    with pytest.raises(InvalidArgument, match="nope"):
        parse_modes("userspace,nope")
    with pytest.raises(InvalidArgument, match="twice"):
        parse_modes("iptables,iptables")


def test_the_modes_fixture_holds_the_chosen_modes(kproxy_modes: tuple[str, ...]) -> None:
    """The session fixture gives registered mode names (the plugin is loaded through pytest11)."""
    assert kproxy_modes and set(kproxy_modes) <= set(kproxy.testing.available_modes())


async def test_the_cluster_fixture_serves_scales_and_removes_services(kproxy_cluster: InProcessCluster) -> None:
    """A Service added with two backends is served round robin; scaled to one, only it answers; removed, gone."""
    web = await kproxy_cluster.add_service("demo/web", (80,), replicas=2)
    backends = await kproxy_cluster.scale(web, 2)
    answers = {await kproxy_cluster.request(web) for _ in range(4)}
    assert answers == set(backends)
    (only,) = await kproxy_cluster.scale(web, 1)
    assert {await kproxy_cluster.request(web) for _ in range(3)} == {only}
    await kproxy_cluster.remove_service(web)
    with pytest.raises(LookupError):
        kproxy_cluster.address(web)


async def test_the_cluster_fixture_serves_udp(kproxy_cluster: InProcessCluster) -> None:
    """A UDP Service's datagrams reach its backend and the answer names it."""
    dns = await kproxy_cluster.add_service("demo/dns", (53,), replicas=1, protocol="UDP")
    (backend,) = await kproxy_cluster.scale(dns, 1, protocol="UDP")
    assert await kproxy_cluster.request(dns, protocol="UDP") == backend


def test_the_public_surface_is_exported_sorted_and_documented() -> None:
    """kproxy.testing.__all__ names each export once (ruff keeps it sorted), each exists and is documented."""
    names = kproxy.testing.__all__
    assert len(names) == len(set(names))
    assert all(hasattr(kproxy.testing, n) for n in names)
    assert all(getattr(kproxy.testing, n).__doc__ for n in names if callable(getattr(kproxy.testing, n)))


def _fresh_pytest(tmp_path: Path, *args: str, ini: str = "[pytest]\n") -> subprocess.CompletedProcess[str]:
    """pytest in a fresh project at ``tmp_path`` (its own rootdir and ``ini``: strict asyncio mode)."""
    (tmp_path / "pytest.ini").write_text(ini)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "-c", str(tmp_path / "pytest.ini"), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)


def test_the_readme_example_passes_in_a_fresh_project_without_warnings(tmp_path: Path) -> None:
    """The README's plugin example and its pytest.ini, copied into a fresh strict-mode project, pass with no warning."""
    readme = (Path(__file__).parents[3] / "README.md").read_text()
    snippet = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "kproxy_cluster" in block)
    ini = next(block for block in re.findall(r"```ini\n(.*?)```", readme, re.S) if "asyncio_default_fixture_loop_scope" in block)
    (tmp_path / "test_readme.py").write_text(snippet)
    result = _fresh_pytest(tmp_path, "--kproxy-modes", "userspace,iptables", "-W", "error::DeprecationWarning", ini=ini)
    assert result.returncode == 0 and "3 passed" in result.stdout, result.stdout + result.stderr
    assert "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr


@pytest.mark.parametrize(("value", "says"), [("userspace,nope", "--kproxy-modes: unknown mode 'nope'"), (",,", "--kproxy-modes: expected mode names")])
def test_a_bad_kproxy_modes_is_one_usage_error_at_start_up(tmp_path: Path, value: str, says: str) -> None:
    """A bad --kproxy-modes stops pytest before any test runs with a usage error prefixed --kproxy-modes:."""
    (tmp_path / "test_any.py").write_text("def test_a():\n    pass\n")
    result = _fresh_pytest(tmp_path, f"--kproxy-modes={value}")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR and says in result.stderr
    assert "passed" not in result.stdout
