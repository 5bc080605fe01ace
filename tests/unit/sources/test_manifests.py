"""Manifest files: formats, problems reported and skipped, and reloads while running."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from kproxy.errors import InvalidArgument, InvalidObject, SourceError
from kproxy.model import EndpointSlice, Service
from kproxy.sources import Event, EventType, ManifestSource, load_manifests
from kproxy.sync import FakeClock
from tests.unit.sync.builders import running

WEB = """\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.0.0.1
  ports: [{port: 80, targetPort: 8080}]
"""
WEB_SLICE = """\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints: [{addresses: [127.0.0.2]}]
ports: [{port: 8080}]
"""


def svc_yaml(name: str, ip: str, port: int = 80) -> str:
    return (f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\n"
            f"spec: {{clusterIP: {ip}, ports: [{{port: {port}}}]}}\n")


def names(objects: Sequence[object]) -> list[str]:
    return sorted(f"{type(o).__name__} {o.namespace}/{o.name}" for o in objects
                  if isinstance(o, Service | EndpointSlice))


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_multi_document_yaml(tmp_path: Path) -> None:
    """Every document of a multi-document YAML file is read."""
    write(tmp_path / "web.yaml", WEB + "---\n" + WEB_SLICE + "---\n")
    objects, problems = load_manifests([tmp_path / "web.yaml"])
    assert problems == []
    assert names(objects) == ["EndpointSlice shop/web-1", "Service shop/web"]


def test_json_and_kind_list(tmp_path: Path) -> None:
    """A JSON file holding a kind: List (with an Endpoints object) yields its items."""
    doc = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db"},
         "spec": {"clusterIP": "10.0.0.3", "ports": [{"port": 5432}]}},
        {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "db"},
         "subsets": [{"addresses": [{"ip": "127.0.0.5"}], "ports": [{"port": 5432}]}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "db"}},
    ]}
    write(tmp_path / "db.json", json.dumps(doc))
    objects, problems = load_manifests([str(tmp_path / "db.json")])
    assert problems == []
    assert names(objects) == ["EndpointSlice default/db-0-ipv4", "Service default/db"]


def test_folder_is_read_recursively_and_other_files_ignored(tmp_path: Path) -> None:
    """A folder gives its *.yaml, *.yml and *.json files at any depth, nothing else."""
    write(tmp_path / "a.yaml", svc_yaml("a", "10.0.0.1"))
    write(tmp_path / "sub" / "deeper" / "b.yml", svc_yaml("b", "10.0.0.2"))
    write(tmp_path / "sub" / "c.json", json.dumps({"apiVersion": "v1", "kind": "Service",
                                                   "metadata": {"name": "c"},
                                                   "spec": {"clusterIP": "10.0.0.3",
                                                            "ports": [{"port": 1}]}}))
    write(tmp_path / "README.md", "not: [a manifest")
    objects, problems = load_manifests([tmp_path])
    assert problems == []
    assert names(objects) == ["Service default/a", "Service default/b", "Service default/c"]


def test_bad_documents_are_reported_and_valid_ones_served(tmp_path: Path) -> None:
    """An invalid object is reported with file, object and field; the others are served."""
    partial = ("apiVersion: v1\nkind: Service\nmetadata: {name: partial}\nspec:\n  clusterIP: 10.0.0.8\n"
               "  ports: [{name: a, port: 80}, {name: b, port: 70000}]\n")
    bad = svc_yaml("bad", "not-an-ip")
    write(tmp_path / "mixed.yaml", "---\n".join([WEB, partial, bad, "- just a list\n"]))
    objects, problems = load_manifests([tmp_path])
    assert names(objects) == ["Service default/partial", "Service shop/web"]
    assert [(type(p), p.field) for p in problems] == [  # type: ignore[union-attr]
        (InvalidObject, "spec.ports[1].port"), (InvalidObject, "spec.clusterIP"), (InvalidObject, "")]
    first = problems[0]
    assert isinstance(first, InvalidObject)
    assert first.source == str(tmp_path / "mixed.yaml")
    assert first.obj == "document 2 Service default/partial"
    assert "document 4" in str(problems[2])


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    """A YAML syntax error is a SourceError naming the file and line; other files still load."""
    write(tmp_path / "ok.yaml", WEB)
    write(tmp_path / "broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: x\n")
    objects, problems = load_manifests([tmp_path])
    assert names(objects) == ["Service shop/web"]
    assert len(problems) == 1 and isinstance(problems[0], SourceError)
    assert f"{tmp_path / 'broken.yaml'}:4" in str(problems[0])


def test_duplicate_object_last_wins_with_a_problem(tmp_path: Path) -> None:
    """The same Service in two files: the later file's definition wins and it is reported."""
    write(tmp_path / "1.yaml", svc_yaml("web", "10.0.0.1"))
    write(tmp_path / "2.yaml", svc_yaml("web", "10.0.0.2"))
    objects, problems = load_manifests([tmp_path])
    assert len(objects) == 1 and isinstance(objects[0], Service)
    assert objects[0].cluster_ips == ("10.0.0.2",)
    assert len(problems) == 1 and "1.yaml" in str(problems[0]) and "last definition" in str(problems[0])


def test_nonexistent_path_raises_naming_it(tmp_path: Path) -> None:
    """A path that does not exist raises SourceError naming it, from both APIs."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SourceError, match=r"nope\.yaml"):
        load_manifests([missing])
    with pytest.raises(SourceError, match=r"nope\.yaml"):
        ManifestSource([tmp_path, missing])


def test_bad_arguments_raise(tmp_path: Path) -> None:
    """No paths, a bare path or a non-positive poll interval raise InvalidArgument."""
    with pytest.raises(InvalidArgument, match="at least one"):
        ManifestSource([])
    with pytest.raises(InvalidArgument, match="single path"):
        load_manifests(str(tmp_path))
    with pytest.raises(InvalidArgument, match="poll_interval_s"):
        ManifestSource([tmp_path], poll_interval_s=0)


class Watcher:
    """Runs a ManifestSource on a FakeClock and keeps the emitted events."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.clock = FakeClock()
        self.source = ManifestSource(paths, poll_interval_s=0.5, clock=self.clock, parse_in_thread=False)
        self.batches: list[list[Event]] = []
        self.synced = False

    def emit(self, batch: Sequence[Event]) -> None:
        self.batches.append(list(batch))

    def set_synced(self) -> None:
        self.synced = True

    async def run(self) -> None:
        await self.source.run(self.emit, self.set_synced)

    def last(self) -> list[tuple[EventType, str]]:
        return [(e.type, str(e.key)) for e in self.batches[-1]]


async def test_initial_objects_then_synced(tmp_path: Path) -> None:
    """run() emits every valid object as ADDED, then reports synced."""
    write(tmp_path / "web.yaml", WEB + "---\n" + WEB_SLICE)
    w = Watcher([tmp_path])
    async with running(w.run):
        assert w.synced
    assert w.last() == [(EventType.ADDED, "EndpointSlice shop/web-1"),
                        (EventType.ADDED, "Service shop/web")]


async def test_edited_file_is_picked_up(tmp_path: Path) -> None:
    """Editing a file while running emits UPDATED for the changed object only, at the next poll."""
    write(tmp_path / "a.yaml", svc_yaml("a", "10.0.0.1"))
    write(tmp_path / "b.yaml", svc_yaml("b", "10.0.0.2"))
    w = Watcher([tmp_path])
    async with running(w.run):
        write(tmp_path / "a.yaml", svc_yaml("a", "10.0.0.11", port=8080))
        await w.clock.run_for(0.5)
    assert len(w.batches) == 2
    assert w.last() == [(EventType.UPDATED, "Service default/a")]
    obj = w.batches[-1][0].obj
    assert isinstance(obj, Service) and obj.cluster_ips == ("10.0.0.11",)


async def test_new_file_in_folder_is_picked_up(tmp_path: Path) -> None:
    """A file created in a watched folder emits ADDED for its objects."""
    write(tmp_path / "a.yaml", svc_yaml("a", "10.0.0.1"))
    w = Watcher([tmp_path])
    async with running(w.run):
        write(tmp_path / "more" / "c.yaml", svc_yaml("c", "10.0.0.3"))
        await w.clock.run_for(0.5)
    assert w.last() == [(EventType.ADDED, "Service default/c")]


async def test_file_that_stops_parsing_keeps_its_last_good_objects(tmp_path: Path) -> None:
    """A syntax error keeps the file's objects, logs file and line, and a fix is picked up."""
    path = tmp_path / "a.yaml"
    write(path, svc_yaml("a", "10.0.0.1"))
    w = Watcher([tmp_path])
    with capture_logs() as logs:
        async with running(w.run):
            write(path, "apiVersion: v1\nkind: Service\n  metadata: [oops\n")
            await w.clock.run_for(1.0)
            assert len(w.batches) == 1
            assert names(w.source.objects()) == ["Service default/a"]
            write(path, svc_yaml("a", "10.0.0.7"))
            await w.clock.run_for(0.5)
    assert w.last() == [(EventType.UPDATED, "Service default/a")]
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1
    assert errors[0]["file"] == str(path) and errors[0]["line"] == 3
    assert errors[0]["kept_objects"] == 1


async def test_deleted_file_deletes_its_objects(tmp_path: Path) -> None:
    """Removing a file emits DELETED for each of its objects, with the last known object."""
    write(tmp_path / "web.yaml", WEB + "---\n" + WEB_SLICE)
    write(tmp_path / "other.yaml", svc_yaml("other", "10.0.0.4"))
    w = Watcher([tmp_path])
    async with running(w.run):
        os.remove(tmp_path / "web.yaml")
        await w.clock.run_for(0.5)
    assert w.last() == [(EventType.DELETED, "EndpointSlice shop/web-1"),
                        (EventType.DELETED, "Service shop/web")]
    assert names(w.source.objects()) == ["Service default/other"]


async def test_invalid_object_is_logged_with_file_object_and_field(tmp_path: Path) -> None:
    """A bad object is logged as an error with file, object and field and is not served."""
    write(tmp_path / "a.yaml", WEB + "---\n" + svc_yaml("bad", "not-an-ip"))
    w = Watcher([tmp_path])
    with capture_logs() as logs:
        async with running(w.run):
            pass
    assert names(w.source.objects()) == ["Service shop/web"]
    (err,) = [e for e in logs if e["log_level"] == "error"]
    assert err["file"] == str(tmp_path / "a.yaml")
    assert "Service default/bad" in err["object"] and err["field"] == "spec.clusterIP"


async def test_duplicate_warning_is_logged_once(tmp_path: Path) -> None:
    """A duplicated object is warned about once, not at every poll."""
    write(tmp_path / "1.yaml", svc_yaml("web", "10.0.0.1"))
    write(tmp_path / "2.yaml", svc_yaml("web", "10.0.0.2"))
    w = Watcher([tmp_path])
    with capture_logs() as logs:
        async with running(w.run):
            write(tmp_path / "3.yaml", svc_yaml("x", "10.0.0.3"))
            await w.clock.run_for(2)
    assert [e["log_level"] for e in logs if "twice" in e["event"]] == ["warning"]
