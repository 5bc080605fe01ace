# ruff: noqa: E501  (test names are kept whole to stay readable)
"""Connection caps sized from RLIMIT_NOFILE, telling a local shortage from a peer's failure, and logging it once."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from kproxy.errors import ConfigError, InvalidArgument
from kproxy.modes.userspace import UserspaceProxy
from kproxy.modes.userspace._table import TABLE_CHANGES_SHOWN
from kproxy.modes.userspace._table import table_changes as _table_changes
from kproxy.modes.userspace.limits import ConnectionLimits, Episode, out_of_resources
from kproxy.modes.userspace.proxy import AddressEntry


def test_default_limits_are_sized_from_the_descriptor_limit() -> None:
    """1024 descriptors give 192 TCP connections (96 per port) and 384 UDP sessions (192 per port)."""
    assert ConnectionLimits.from_nofile(1024) == ConnectionLimits(
        max_connections=192, max_connections_per_service=96, max_udp_sessions=384, max_udp_sessions_per_service=192)
    big = ConnectionLimits.from_nofile(1 << 20)
    assert (big.max_connections, big.max_udp_sessions) == (196_608, 393_216)
    assert ConnectionLimits.from_nofile(1 << 40) == big  # sizing stops at fs.nr_open's default


def test_a_limit_given_wins_over_the_sized_default() -> None:
    """An override replaces only its field; None keeps the sized default."""
    limits = ConnectionLimits.from_nofile(1024, max_connections=5, max_udp_sessions=None)
    assert (limits.max_connections, limits.max_udp_sessions, limits.max_connections_per_service) == (5, 384, 96)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"max_connections": 0}, "max_connections must be an int >= 1, got max_connections=0"),
    ({"max_udp_sessions": True}, "max_udp_sessions must be an int >= 1"),
    ({"max_sessions": 3}, "unknown connection limits ['max_sessions']"),
])
def test_a_bad_limit_is_refused_naming_the_field(kwargs: dict[str, object], says: str) -> None:
    """A limit that is not an int >= 1, or an unknown one, raises InvalidArgument naming it."""
    with pytest.raises(InvalidArgument) as err:
        ConnectionLimits.from_nofile(1024, **kwargs)  # type: ignore[arg-type]
    assert says in str(err.value)


def test_running_out_of_descriptors_is_told_apart_from_an_endpoint_failure() -> None:
    """EMFILE/ENFILE/ENOBUFS are local; a refused or reset dial is the endpoint's; EADDRNOTAVAIL is local only for a dial."""
    for code in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
        assert out_of_resources(OSError(code, "x"))
    assert not out_of_resources(ConnectionRefusedError(errno.ECONNREFUSED, "refused"), dial=True)
    assert not out_of_resources(TimeoutError())
    assert out_of_resources(OSError(errno.EADDRNOTAVAIL, "x"), dial=True)
    assert not out_of_resources(OSError(errno.EADDRNOTAVAIL, "x"))


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_an_episode_logs_once_when_it_starts_and_once_when_it_settles() -> None:
    """Many hits log one warning; a success within the settle time keeps the episode; one after ends it with the count."""
    import structlog

    clock = _Clock()
    with capture_logs() as logs:
        episode = Episode(structlog.get_logger("t"), "out of file descriptors", effect="clients are reset", clock=clock)
        for _ in range(50):
            episode.hit(failed="accept")
        clock.now_s += 0.5
        episode.clear()  # too soon: a flapping shortage stays one episode
        episode.hit(failed="dial")
        clock.now_s += 1.0
        episode.clear()
        episode.clear()
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("out of file descriptors", "warning"), ("out of file descriptors: cleared", "info")]
    assert logs[0]["failed"] == "accept" and logs[0]["effect"] == "clients are reset"
    assert logs[1]["occurrences"] == 51


def _entry(service: str, listen: str, cluster_ip: str = "10.96.0.1") -> AddressEntry:
    return AddressEntry(service=service, protocol="TCP", cluster_ip=cluster_ip, port=80, listen=listen)


def test_the_address_table_changes_name_added_removed_and_moved_entries() -> None:
    """Between two tables: a new entry is added, a gone one removed, one with a new listen address moved."""
    old = [_entry("a/keep", "127.0.0.2:80"), _entry("a/gone", "127.0.0.3:80"), _entry("a/move", "127.0.0.4:80")]
    new = [_entry("a/keep", "127.0.0.2:80"), _entry("a/move", "127.0.0.4:31000"), _entry("a/new", "127.0.0.5:80")]
    assert _table_changes(old, new) == {
        "added": ["a/new TCP 10.96.0.1:80 at 127.0.0.5:80"],
        "removed": ["a/gone TCP 10.96.0.1:80 was at 127.0.0.3:80"],
        "moved": ["a/move TCP 127.0.0.4:80 -> 127.0.0.4:31000"],
    }
    assert _table_changes(new, new) == {}


def test_the_address_table_changes_name_ten_of_each_kind_then_count_the_rest() -> None:
    """200 new entries log the first ten and 'and 190 more'."""
    new = [_entry(f"load/s{i:03}", f"127.1.0.{i}:80", cluster_ip=f"10.96.1.{i}") for i in range(200)]
    added = _table_changes([], new)["added"]
    assert len(added) == TABLE_CHANGES_SHOWN + 1 and added[-1] == "and 190 more"


def test_an_address_map_that_is_a_folder_is_refused_naming_the_flag(tmp_path: Path) -> None:
    """A folder, or a file in a missing folder, as the address map is a ConfigError naming --address-map."""
    with pytest.raises(ConfigError, match=r"--address-map: .* is a folder; give the path of a file"):
        UserspaceProxy(address_map_path=tmp_path)
    with pytest.raises(ConfigError, match=r"--address-map: folder .* does not exist"):
        UserspaceProxy(address_map_path=tmp_path / "missing" / "map.json")
    UserspaceProxy(address_map_path=tmp_path / "map.json")  # a file in an existing folder is fine


def test_kproxy_run_refuses_an_address_map_folder_at_start_up(tmp_path: Path) -> None:
    """`kproxy run --address-map FOLDER` exits 2 at once with the message naming --address-map."""
    manifests = Path(__file__).parents[3] / "examples" / "cluster.yaml"
    result = subprocess.run([sys.executable, "-m", "kproxy", "run", "--manifests", str(manifests),
                             "--address-map", str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert f"--address-map: '{tmp_path}' is a folder" in result.stderr
