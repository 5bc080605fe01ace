"""Manifest edge cases a user meets: BOMs, concatenated JSON, one file named twice, ignored files."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

from kproxy.sources import ManifestSource, load_manifests
from kproxy.sources import manifests as manifests_module

SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
           "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}}


def _other(name: str, ip: str) -> dict[str, object]:
    return {**SERVICE, "metadata": {"name": name, "namespace": "shop"},
            "spec": {"clusterIP": ip, "ports": [{"port": 80}]}}


def test_json_with_byte_order_mark_is_read(tmp_path: Path) -> None:
    """A JSON file starting with a UTF-8 byte-order mark parses, as kubectl accepts it."""
    path = tmp_path / "svc.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(SERVICE).encode())
    objects, problems = load_manifests([path])
    assert problems == [] and [o.name for o in objects] == ["web"]


def test_concatenated_json_objects_are_all_read(tmp_path: Path) -> None:
    """Several JSON objects one after another in one file are each read."""
    path = tmp_path / "svc.json"
    path.write_text(json.dumps(SERVICE) + "\n" + json.dumps(_other("api", "10.0.0.2")) + "\n")
    objects, problems = load_manifests([path])
    assert problems == [] and sorted(o.name for o in objects) == ["api", "web"]


def test_file_named_twice_is_read_once(tmp_path: Path) -> None:
    """A file reached through its folder and its own path is one file: no duplicate warning."""
    path = tmp_path / "svc.json"
    path.write_text(json.dumps(SERVICE))
    objects, problems = load_manifests([tmp_path, path])
    assert problems == [] and [o.name for o in objects] == ["web"]


def test_ignored_file_inside_a_folder_is_not_read(tmp_path: Path) -> None:
    """A file given in ``ignore`` (such as the address map) is skipped even inside a watched folder."""
    (tmp_path / "svc.json").write_text(json.dumps(SERVICE))
    address_map = tmp_path / "addresses.json"
    address_map.write_text("[]")
    source = ManifestSource([tmp_path], ignore=[address_map], parse_in_thread=False)
    source.reload()
    assert source.problems() == [] and [o.name for o in source.objects()] == ["web"]


async def test_reload_runs_off_the_event_loop(tmp_path: Path, monkeypatch: object) -> None:
    """While running, files are parsed in a worker thread so the event loop keeps serving traffic."""
    (tmp_path / "svc.json").write_text(json.dumps(SERVICE))
    threads: list[int] = []
    original = manifests_module._parse_file

    def spy(path: Path) -> object:
        threads.append(threading.get_ident())
        return original(path)

    monkeypatch.setattr(manifests_module, "_parse_file", spy)  # type: ignore[attr-defined]
    synced = asyncio.Event()
    source = ManifestSource([tmp_path])
    task = asyncio.create_task(source.run(lambda events: None, synced.set))
    try:
        await asyncio.wait_for(synced.wait(), 5)
    finally:
        task.cancel()
    assert threads and threading.get_ident() not in threads
