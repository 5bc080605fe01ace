"""Manifest files for the harness API server: read as raw objects, polled for changes.

Files or folders (``*.yaml``, ``*.yml``, ``*.json``, sorted), multi-document YAML, ``kind: List``
flattened, as ``kubectl get -o yaml`` writes them. Only the kinds the server serves are kept (the
rest is logged once per reload). A file that stops parsing keeps its last good objects, as
``kproxy run --manifests`` does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
import yaml

from kproxy.cluster.store import resource_of_kind
from kproxy.errors import SourceError

__all__ = ["ManifestFiles"]

_SUFFIXES = (".yaml", ".yml", ".json")
_log = structlog.get_logger("kproxy.cluster")


def _flatten(doc: Any) -> list[Mapping[str, Any]]:
    if not isinstance(doc, Mapping):
        return []
    if doc.get("kind") == "List" or (isinstance(doc.get("kind"), str) and doc["kind"].endswith("List")
                                     and isinstance(doc.get("items"), list)):
        out: list[Mapping[str, Any]] = []
        for item in doc.get("items") or []:
            out += _flatten(item)
        return out
    return [doc]


class ManifestFiles:
    """The manifests under ``paths``, re-read on :meth:`load` when :meth:`changed` says so.

    Raises:
        SourceError: a path that does not exist (at construction).
    """

    def __init__(self, paths: Sequence[Path]) -> None:
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            raise SourceError(f"--manifests: no such file or folder: {', '.join(missing)}")
        self.paths = list(paths)
        self._good: dict[Path, list[Mapping[str, Any]]] = {}
        self._signature: tuple[tuple[str, int, int], ...] = ()

    def _files(self) -> list[Path]:
        out: list[Path] = []
        for path in self.paths:
            if path.is_dir():
                out += sorted(p for p in path.rglob("*") if p.suffix in _SUFFIXES and p.is_file())
            elif path.exists():
                out.append(path)
        return out

    def _stat(self) -> tuple[tuple[str, int, int], ...]:
        sig = []
        for f in self._files():
            try:
                st = os.stat(f)
            except OSError:
                continue
            sig.append((str(f), st.st_mtime_ns, st.st_size))
        return tuple(sig)

    def changed(self) -> bool:
        """Whether a file was added, removed or modified since the last :meth:`load`."""
        return self._stat() != self._signature

    def load(self) -> list[Mapping[str, Any]]:
        """Every served object of every file (the last good content of a file that fails)."""
        self._signature = self._stat()
        objects: list[Mapping[str, Any]] = []
        files = self._files()
        for path in files:
            try:
                docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
            except (OSError, yaml.YAMLError, UnicodeDecodeError) as err:
                _log.warning("manifest file unreadable; keeping its last good objects", file=str(path),
                             error=str(err).splitlines()[0] if str(err) else type(err).__name__)
                objects += self._good.get(path, [])
                continue
            found = [o for d in docs for o in _flatten(d)]
            kept = [o for o in found if isinstance(o.get("kind"), str) and resource_of_kind(o["kind"])
                    and isinstance((o.get("metadata") or {}).get("name"), str)]
            skipped = sorted({str(o.get("kind")) for o in found if o not in kept})
            if skipped:
                _log.info("manifest objects not served", file=str(path), kinds=skipped)
            self._good[path] = kept
            objects += kept
        for gone in set(self._good) - set(files):
            del self._good[gone]
        return objects
