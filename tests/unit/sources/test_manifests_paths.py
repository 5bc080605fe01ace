"""A ``--manifests`` path that goes away or cannot be read keeps its last good objects until it is back."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from kproxy.errors import SourceError
from kproxy.sources import EventType
from kproxy.sources.manifests import ManifestSource

_NOBODY = 65534


def _svc(name: str, ip: str) -> str:
    return (f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n"
            f"spec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n")


def _names(source: ManifestSource) -> set[str]:
    return {o.name for o in source.objects()}


def _folder(root: Path) -> Path:
    folder = root / "m"
    folder.mkdir()
    (folder / "a.yaml").write_text(_svc("web", "10.96.0.10"))
    (folder / "b.yaml").write_text(_svc("db", "10.96.0.11"))
    return folder


def test_a_folder_moved_away_keeps_every_object_until_it_is_back(tmp_path: Path) -> None:
    """mv m m.gone: no deletion and one error naming m; mv back: still served, and edits apply again."""
    folder = _folder(tmp_path)
    source = ManifestSource([folder], parse_in_thread=False)
    source.reload()
    folder.rename(tmp_path / "m.gone")
    with capture_logs() as logs:
        assert source.reload() == []
        assert source.reload() == []
    assert _names(source) == {"web", "db"}
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1 and errors[0]["path"] == str(folder)
    assert any(isinstance(p, SourceError) and str(folder) in str(p) for p in source.problems())
    (tmp_path / "m.gone").rename(folder)
    (folder / "b.yaml").unlink()  # a file gone from a readable folder is positive evidence
    events = source.reload()
    assert [(e.type, e.obj.name) for e in events] == [(EventType.DELETED, "db")]
    assert not any(isinstance(p, SourceError) for p in source.problems())


def test_a_dangling_symlink_keeps_the_objects_of_its_last_target(tmp_path: Path) -> None:
    """A --manifests symlink whose target folder vanished deletes nothing; a new target is read."""
    target = _folder(tmp_path)
    link = tmp_path / "current"
    link.symlink_to(target, target_is_directory=True)
    source = ManifestSource([link], parse_in_thread=False)
    source.reload()
    shutil.rmtree(target)
    assert source.reload() == []
    assert _names(source) == {"web", "db"}
    target.mkdir()
    (target / "a.yaml").write_text(_svc("web", "10.96.0.10"))
    events = source.reload()
    assert [(e.type, e.obj.name) for e in events] == [(EventType.DELETED, "db")]


def test_a_file_given_by_name_that_vanishes_keeps_its_objects(tmp_path: Path) -> None:
    """A file named on the command line that disappears is not evidence of deletion."""
    folder = _folder(tmp_path)
    source = ManifestSource([folder / "a.yaml"], parse_in_thread=False)
    source.reload()
    (folder / "a.yaml").unlink()
    assert source.reload() == []
    assert _names(source) == {"web"}


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A temporary folder another user can search (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="kproxy-manifests-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for root, dirs, _ in os.walk(path):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        shutil.rmtree(path)


def _reload_as_nobody(source: ManifestSource) -> dict[str, object]:
    """Reload ``source`` in a child process that dropped to the nobody user; what it saw."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no return from here
        try:
            os.close(read_end)
            os.setgid(_NOBODY)
            os.setuid(_NOBODY)
            events = source.reload()
            out = {"events": [(str(e.type), e.obj.name) for e in events], "names": sorted(_names(source)),
                   "problems": [str(p) for p in source.problems()]}
            os.write(write_end, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    result: dict[str, object] = json.loads(data)
    return result


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_a_folder_kproxy_cannot_read_keeps_every_object(world_readable_dir: Path) -> None:
    """chmod 000 on the folder, read as an unprivileged user: nothing deleted, the folder named."""
    folder = _folder(world_readable_dir)
    sub = folder / "team"
    sub.mkdir()
    (sub / "c.yaml").write_text(_svc("cache", "10.96.0.12"))
    source = ManifestSource([folder], parse_in_thread=False)
    source.reload()
    assert _names(source) == {"web", "db", "cache"}
    sub.chmod(0o000)  # an unreadable subfolder: only its files are kept as they were
    seen = _reload_as_nobody(source)
    assert seen["events"] == [] and seen["names"] == ["cache", "db", "web"]
    folder.chmod(0o000)
    seen = _reload_as_nobody(source)
    assert seen["events"] == [] and seen["names"] == ["cache", "db", "web"]
    problems = seen["problems"]
    assert isinstance(problems, list) and any(str(folder) in p for p in problems)
