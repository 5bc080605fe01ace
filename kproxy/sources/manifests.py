"""Services and EndpointSlices from YAML and JSON files, reloaded when they change.

Files are given one by one or as folders (searched recursively for ``*.yaml``, ``*.yml`` and
``*.json``, in sorted path order). A YAML file may hold several documents; any document may be a
``kind: List`` as ``kubectl get -o yaml`` writes it; v1 Endpoints are converted to slices (all
through :func:`kproxy.model.parse_objects`, which also applies the API server's defaults).

Theory of operation
-------------------
Nothing bad in a file stops the rest: an invalid object (or part of one) is logged with its
file, object and field and left out; a file that no longer parses (a YAML syntax error, often a
save in progress) is logged with its line and keeps serving its last good objects; a deleted
file deletes its objects. The same object (kind, namespace, name) defined twice is a warning
naming the document of each definition, and the last definition wins (files in order,
documents in order), as ``kubectl apply`` of both would leave it.

Deleting objects needs positive evidence: a readable file without them, or a file gone from a
folder that could be read. A given path that is missing (moved away, a dangling symlink) or a
folder that cannot be listed (permissions) is an error naming it, logged once, and every object
of the files under it is kept until the path is back; kube-proxy likewise keeps its rules when
its informers lose the API server. (A missing path at start is still an error: there is no last
good state to keep.)

:class:`ManifestSource` polls: every ``poll_interval_s`` it stats every file and re-reads those
whose inode, size, mtime or ctime changed, then emits the difference between the objects it
served and the objects it now sees (:func:`kproxy.sources.base.diff_objects`). Polling with
``os.stat`` needs no dependency and works on every filesystem (inotify misses network mounts
and editors that replace files). Files are read synchronously: manifests are small.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat as stat_module
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import yaml

from kproxy.clock import Clock, MonotonicClock
from kproxy.errors import InvalidArgument, InvalidObject, SourceError
from kproxy.model import KubeObject, parse_objects
from kproxy.sources._gcpause import collector_paused
from kproxy.sources.base import Emit, Event, ObjectKey, Synced, diff_objects, object_key
from kproxy.sources.yamlfast import load_all as yaml_load_all

__all__ = ["MANIFEST_SUFFIXES", "ManifestSource", "Progress", "load_manifests"]

#: The file name endings read inside folders (a file given by name is read whatever its name).
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")

_log = structlog.get_logger("kproxy.sources")


@dataclass(slots=True)
class _Parsed:
    """One file's objects (with where each was found: a label and the 1-based document index)
    and the problems of its objects."""

    objects: list[tuple[KubeObject, str, int]] = field(default_factory=list)
    problems: list[InvalidObject] = field(default_factory=list)


def _check_paths(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    if isinstance(paths, str | bytes | os.PathLike):
        raise InvalidArgument(f"expected a list of paths, got a single path {paths!r}; wrap it in a list")
    out = [Path(p) for p in paths]
    if not out:
        raise InvalidArgument("expected at least one manifest file or folder, got none")
    for path in out:
        if not path.exists():
            raise SourceError(f"manifest path {str(path)!r} does not exist; expected a file or a folder")
    return out


def _walk(folder: Path, unavailable: dict[Path, str]) -> list[Path]:
    """The manifest files under ``folder`` (symlinks followed, loops cut), sorted; folders that
    cannot be listed go into ``unavailable`` with the reason."""
    found: list[Path] = []
    visited: set[tuple[int, int]] = set()

    def on_error(err: OSError) -> None:
        where = Path(err.filename) if err.filename else folder
        unavailable[where] = err.strerror or str(err)

    for root, dirs, files in os.walk(folder, onerror=on_error, followlinks=True):
        try:
            st = os.stat(root)
        except OSError as err:
            on_error(err)
            dirs[:] = []
            continue
        if (st.st_dev, st.st_ino) in visited:  # a symlink loop
            dirs[:] = []
            continue
        visited.add((st.st_dev, st.st_ino))
        base = Path(root)
        found.extend(base / name for name in files
                     if Path(name).suffix in MANIFEST_SUFFIXES and (base / name).is_file())
    return sorted(found)


def _expand(
    paths: Sequence[Path], ignore: frozenset[Path] = frozenset(),
    unavailable: dict[Path, str] | None = None,
) -> list[Path]:
    """Every manifest file under ``paths``: files as given, folders recursively, no duplicates.

    A file reached twice (through two paths naming it) counts once; files in ``ignore``
    (resolved paths, e.g. kproxy's own ``--address-map``) are left out. A given path that is
    missing, or a folder that cannot be listed, is put into ``unavailable`` (path -> reason).
    """
    seen: set[Path] = set(ignore)
    out: list[Path] = []
    missing: dict[Path, str] = {} if unavailable is None else unavailable
    for path in paths:
        try:
            st = path.stat()
        except OSError as err:  # gone, a dangling symlink, or a parent that cannot be searched
            missing[path] = err.strerror or str(err)
            continue
        if stat_module.S_ISDIR(st.st_mode):
            try:
                os.scandir(path).close()
            except OSError as err:
                missing[path] = err.strerror or str(err)
                continue
            found = _walk(path, missing)
        else:
            found = [path]
        for p in found:
            real = _resolve(p)
            if real not in seen:
                seen.add(real)
                out.append(p)
    return out


def _resolve(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:  # a symlink loop: keep the path as given
        return path


def _under(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def _under_any(path: Path, tops: Iterable[Path]) -> bool:
    """``path`` is, or is inside, one of ``tops`` (a missing given path or an unreadable folder)."""
    return any(_under(path, top) for top in tops)




def _json_documents(text: str) -> list[Any]:
    """Every JSON value in ``text``: one, or several one after another (as kubectl accepts)."""
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return docs
        doc, pos = decoder.raw_decode(text, pos)
        docs.append(doc)


class _FileError(SourceError):
    """A manifest file that cannot be used; ``path`` and ``line`` (1-based, or None) locate it."""

    def __init__(self, message: str, *, path: Path, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


def _syntax_error(path: Path, err: Exception) -> _FileError:
    line = None
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        line = err.problem_mark.line + 1
    elif isinstance(err, json.JSONDecodeError):
        line = err.lineno
    where = f"{path}:{line}" if line is not None else str(path)
    kind = "JSON" if isinstance(err, json.JSONDecodeError) else "YAML"
    detail = " ".join(str(err).split())
    return _FileError(f"{where}: {kind} syntax error, file skipped: {detail}", path=path, line=line)


#: What :func:`load_manifests` reports as it reads: ``(path, documents read, documents in the file)``
#: (the count is an estimate until the file is done: its ``---`` separators).
Progress = Callable[[str, int, int], None]


def _parse_file(path: Path, progress: Progress | None = None) -> _Parsed:
    """Read and parse one manifest file, reporting each document to ``progress``.

    Raises:
        SourceError: the file cannot be read, is not UTF-8, or is not valid YAML/JSON (the
            message names the file and the line).
    """
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise _FileError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})",
                         path=path) from err
    except OSError as err:
        raise _FileError(f"{path}: cannot read: {err.strerror or err}", path=path) from err
    try:
        if path.suffix == ".json":
            docs = _json_documents(text)
        elif progress is None:
            docs = list(yaml_load_all(text))
        else:
            estimate = text.count("\n---") + 1
            docs = []
            for doc in yaml_load_all(text):
                docs.append(doc)
                progress(str(path), len(docs), max(estimate, len(docs)))
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise _syntax_error(path, err) from err
    parsed = _Parsed()
    several = len([d for d in docs if d is not None]) > 1
    for i, doc in enumerate(docs, start=1):
        where = f"document {i}" if several else ""
        result = parse_objects(doc, source=str(path), where=where)
        parsed.objects.extend((obj, where, i) for obj in result.objects)
        parsed.problems.extend(result.problems)
    return parsed


def _merge(
    files: Iterable[tuple[Path, _Parsed]],
) -> tuple[dict[ObjectKey, KubeObject], list[InvalidObject]]:
    """Merge files in order; a later definition of a key wins and is reported."""
    merged: dict[ObjectKey, KubeObject] = {}
    origin: dict[ObjectKey, str] = {}
    duplicates: list[InvalidObject] = []
    for path, parsed in files:
        for obj, where, index in parsed.objects:
            key = object_key(obj)
            here = f"{path} document {index}"
            if key in origin:
                duplicates.append(InvalidObject(
                    source=str(path), obj=f"{where} {key}".strip(), field="metadata.name",
                    problem=f"{key} is also defined in {origin[key]}; the last definition "
                            f"({here}) wins"))
            merged[key] = obj
            origin[key] = here
    return merged, duplicates


def load_manifests(
    paths: Iterable[str | os.PathLike[str]], *, progress: Progress | None = None,
) -> tuple[list[KubeObject], list[InvalidObject | SourceError]]:
    """Read manifest files and folders once (for ``kproxy render``-like commands).

    Args:
        paths: files or folders.
        progress: called after each YAML document (see :data:`Progress`), for a progress bar.

    Returns:
        ``(objects, problems)``: every valid Service and EndpointSlice (one per kind, namespace
        and name: the last definition), and every problem: :class:`InvalidObject` for an invalid
        or duplicated object, :class:`SourceError` for a file that cannot be read or parsed.

    Raises:
        SourceError: a path does not exist.
        InvalidArgument: no path, or a single path not in a list.
    """
    files: list[tuple[Path, _Parsed]] = []
    problems: list[InvalidObject | SourceError] = []
    with collector_paused():  # 20,000 Services are millions of objects: no full collections meanwhile
        for path in _expand(_check_paths(paths)):
            try:
                parsed = _parse_file(path, progress)
            except SourceError as err:
                problems.append(err)
                continue
            files.append((path, parsed))
            problems.extend(parsed.problems)
    merged, duplicates = _merge(files)
    problems.extend(duplicates)
    return list(merged.values()), problems


@dataclass(frozen=True, slots=True)
class _Stat:
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int


def _stat(path: Path) -> _Stat | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return _Stat(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ManifestSource:
    """A Source serving the objects of manifest files, reloaded when they change.

    Args:
        paths: files or folders (see the module docstring).
        poll_interval_s: seconds between two checks for changes (> 0).
        clock: the time source (default :class:`~kproxy.clock.MonotonicClock`).
        ignore: files never read even when inside a given folder (e.g. the ``--address-map``).
        parse_in_thread: re-read files in a worker thread so a large file never stalls the
            event loop (and the traffic it serves); False keeps everything on the loop, which
            tests driving a FakeClock need for determinism.

    Raises:
        SourceError: a path does not exist (also raised by :meth:`run` if it is gone by then).
        InvalidArgument: no path, or ``poll_interval_s`` <= 0.
    """

    def __init__(
        self,
        paths: Iterable[str | os.PathLike[str]],
        *,
        poll_interval_s: float = 0.5,
        clock: Clock | None = None,
        ignore: Iterable[str | os.PathLike[str]] = (),
        parse_in_thread: bool = True,
    ) -> None:
        if isinstance(poll_interval_s, bool) or not isinstance(poll_interval_s, int | float) \
                or not poll_interval_s > 0:
            raise InvalidArgument(f"poll_interval_s must be > 0 seconds, got {poll_interval_s=!r}")
        self._paths = _check_paths(paths)
        self._ignore = frozenset(_resolve(Path(p)) for p in ignore)
        self._parse_in_thread = parse_in_thread
        self._poll_interval_s = float(poll_interval_s)
        self._clock: Clock = clock or MonotonicClock()
        self._stats: dict[Path, _Stat | None] = {}
        self._files: dict[Path, _Parsed] = {}
        self._broken: dict[Path, _FileError] = {}
        self._view: dict[ObjectKey, KubeObject] = {}
        self._reported_duplicates: set[str] = set()
        self._unavailable: dict[Path, str] = {}
        self.reload_count = 0

    @property
    def paths(self) -> tuple[Path, ...]:
        """The paths given."""
        return tuple(self._paths)

    def objects(self) -> tuple[KubeObject, ...]:
        """The objects served now."""
        return tuple(self._view.values())

    def problems(self) -> list[InvalidObject | SourceError]:
        """The problems found by the last reload: bad files, bad objects, duplicates."""
        out: list[InvalidObject | SourceError] = [
            SourceError(f"manifest path {str(p)!r} cannot be read ({why}); its last good objects are kept")
            for p, why in self._unavailable.items()]
        out.extend(self._broken.values())
        for parsed in self._files.values():
            out.extend(parsed.problems)
        _, duplicates = _merge(self._files.items())
        out.extend(duplicates)
        return out

    async def run(self, emit: Emit, synced: Synced) -> None:
        """Emit the objects of every file, call ``synced()``, then poll for changes until cancelled.

        Raises:
            SourceError: a path does not exist.
        """
        _check_paths(self._paths)
        emit(await self._reload())
        synced()
        while True:
            await self._clock.sleep(self._poll_interval_s)
            # Parsing a large file takes a while: off the event loop, so traffic keeps flowing.
            events = await self._reload()
            if events:
                emit(events)

    async def _reload(self) -> list[Event]:
        if self._parse_in_thread:
            return await asyncio.to_thread(self._reload_paused)
        return self.reload()

    def _reload_paused(self) -> list[Event]:
        with collector_paused():  # a full collection mid-parse would stall the loop too
            return self.reload()

    def reload(self) -> list[Event]:
        """Re-read the files that changed and return the events since the last reload.

        Returns:
            ``list[Event]``: what changed in the served objects (empty when nothing did).
        """
        self.reload_count += 1
        unavailable: dict[Path, str] = {}
        found = _expand(self._paths, self._ignore, unavailable)
        self._report_unavailable(unavailable)
        kept = [p for p in self._stats if p not in found and _under_any(p, unavailable)]
        found_set = set(found)
        for path in [p for p in self._stats if p not in found_set and p not in kept]:
            del self._stats[path]
            self._broken.pop(path, None)
            if self._files.pop(path, None) is not None:
                _log.info("manifest file removed; its objects are deleted", file=str(path))
        for path in found:
            stat = _stat(path)
            if path in self._stats and stat == self._stats[path]:
                continue
            self._stats[path] = stat
            self._load(path)
        ordered = [(p, self._files[p]) for p in sorted(found_set.union(kept), key=self._order)
                   if p in self._files]
        merged, duplicates = _merge(ordered)
        for dup in duplicates:
            if str(dup) not in self._reported_duplicates:
                _log.warning("object defined twice; the last definition wins", file=dup.source,
                             object=dup.obj, field=dup.field, problem=dup.problem)
        self._reported_duplicates = {str(d) for d in duplicates}
        events = diff_objects(self._view, merged)
        self._view = merged
        return events

    def _order(self, path: Path) -> tuple[int, Path]:
        """Merge order: by the given path the file is under, then by file path."""
        for i, given in enumerate(self._paths):
            if _under(path, given):
                return i, path
        return len(self._paths), path

    def _report_unavailable(self, now: dict[Path, str]) -> None:
        for path, why in now.items():
            if self._unavailable.get(path) != why:
                _log.error("manifest path cannot be read; its last good objects are kept until it is back",
                           path=str(path), error=why)
        for path in self._unavailable.keys() - now.keys():
            _log.info("manifest path is readable again", path=str(path))
        self._unavailable = now

    def _load(self, path: Path) -> None:
        try:
            parsed = _parse_file(path)
        except _FileError as err:
            self._broken[path] = err
            kept = len(self._files[path].objects) if path in self._files else 0
            _log.error("manifest file skipped; its last good objects are kept", file=str(path),
                       line=err.line, error=str(err), kept_objects=kept)
            return
        self._broken.pop(path, None)
        self._files[path] = parsed
        for problem in parsed.problems:
            _log.error("invalid manifest content skipped", file=problem.source, object=problem.obj,
                       field=problem.field, problem=problem.problem, error=str(problem))
