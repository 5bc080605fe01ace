"""Architecture rules that keep the layers honest, checked on the source text."""

from __future__ import annotations

import ast
import builtins
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kproxy
import kproxy.errors
from kproxy.modes import MODES

ROOT = Path(__file__).resolve().parents[2]

#: The import order, lowest first: a module may import its own package and the packages before
#: it, never one after it (README, "Architecture"). ``kproxy/__init__.py`` exports lazily and
#: ``kproxy/__main__.py`` only calls the CLI, so both stand outside the order.
LAYERS = ("errors", "model", "clock", "config", "sources", "sync", "observability", "portforward",
          "kernel", "modes", "trace", "cluster", "daemon", "testing", "cli")

#: Imports inside functions, each with its reason; any other is a cycle being dodged. The CLI
#: imports a command's machinery only when that command runs (start-up time, and Hypothesis only
#: for verify); a cluster source's kube client is heavy and optional.
DEFERRED_IMPORTS = {
    "kproxy/cli/": "a command's machinery is imported when the command runs",
    "kproxy/daemon/setup.py": "the kube client is imported only for a cluster source",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _py_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", _py_files("emulation"), ids=str)
def test_emulation_never_imports_kproxy(path: Path) -> None:
    """The kernel models stand alone, so they can read any node's rules."""
    assert not {m for m in _imports(path) if m == "kproxy" or m.startswith("kproxy.")}


def _layer(path: Path) -> str | None:
    parts = path.relative_to(ROOT / "kproxy").with_suffix("").parts
    return None if parts in (("__init__",), ("__main__",)) else parts[0]


def _kproxy_imports(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, module, inside_a_function)`` for every ``kproxy.*`` import of ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nested: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            nested.update(id(n) for n in ast.walk(fn))
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        out.extend((node.lineno, n, id(node) in nested) for n in names if n.startswith("kproxy."))
    return out


def test_every_package_has_a_layer() -> None:
    """Each top-level part of kproxy/ is in the import order, and each layer exists."""
    entries = [p for p in (ROOT / "kproxy").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()]
    parts = {p.stem for p in entries} - {"__init__", "__main__"}
    assert parts == set(LAYERS)


@pytest.mark.parametrize("path", _py_files("kproxy"), ids=str)
def test_imports_follow_the_layer_order(path: Path) -> None:
    """A module imports only its own layer and the layers below it, at any depth (TYPE_CHECKING too)."""
    layer = _layer(path)
    if layer is None:
        return
    rank = LAYERS.index(layer)
    bad = [f"line {line}: {module}" for line, module, _ in _kproxy_imports(path)
           if LAYERS.index(module.split(".")[1]) > rank]
    assert not bad, f"{path.relative_to(ROOT)} ({layer}) imports from above its layer: {bad}"


@pytest.mark.parametrize("path", _py_files("kproxy"), ids=str)
def test_no_function_level_imports_outside_the_declared_places(path: Path) -> None:
    """Imports inside functions exist only where DEFERRED_IMPORTS says why (never to dodge a cycle)."""
    rel = str(path.relative_to(ROOT))
    if any(rel.startswith(prefix) for prefix in DEFERRED_IMPORTS):
        return
    deferred = [f"line {line}: {module}" for line, module, inside in _kproxy_imports(path) if inside]
    assert not deferred, f"{rel} imports inside functions: {deferred}"


def test_importing_the_model_loads_no_data_plane() -> None:
    """`import kproxy.model` (through the lazy top-level package) loads no relay, event loop,
    logging, kube client or Hypothesis."""
    code = ("import sys, kproxy.model; "
            "print(' '.join(m for m in sys.modules if m.split('.')[0] in "
            "('asyncio', 'structlog', 'kubernetes_asyncio', 'hypothesis', 'uvloop') "
            "or m.startswith(('kproxy.modes', 'kproxy.daemon', 'kproxy.sources', 'kproxy.sync'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == []


def test_top_level_names_resolve_lazily() -> None:
    """Every name of kproxy.__all__ resolves on first use, and an unknown one is an AttributeError."""
    for name in kproxy.__all__:
        assert getattr(kproxy, name) is not None
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = kproxy.no_such_name  # type: ignore[attr-defined]


def test_every_mode_package_is_registered_once() -> None:
    """Each package under kproxy/modes/ is in MODES, and MODES names only packages that exist."""
    packages = {p.name for p in (ROOT / "kproxy" / "modes").iterdir() if (p / "__init__.py").exists()}
    assert packages == {info.package.rsplit(".", 1)[1] for info in MODES.values()}
    assert all(info.package == f"kproxy.modes.{name}" for name, info in MODES.items())


@pytest.mark.parametrize("path", _py_files("kproxy/model"), ids=str)
def test_model_is_pure(path: Path) -> None:
    """The model does no I/O: no asyncio, sockets, subprocesses or clocks."""
    forbidden = {"asyncio", "socket", "subprocess", "time", "random", "os"}
    assert not (_imports(path) & forbidden)


def _docstrings() -> list[tuple[str, str]]:
    found = []
    for info in pkgutil.walk_packages(kproxy.__path__, "kproxy."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        path = getattr(module, "__file__", None)
        if not path:
            continue
        tree = ast.parse(Path(path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                doc = ast.get_docstring(node)
                if doc:
                    found.append((f"{info.name}.{node.name}", doc))
    return found


def test_docstrings_raise_only_exceptions_that_exist() -> None:
    """Every name under a docstring's ``Raises:`` is defined in kproxy.errors or is a builtin."""
    known = set(kproxy.errors.__all__) | {n for n in dir(builtins) if n.endswith(("Error", "Exception"))}
    known |= {"TimeoutError", "KeyboardInterrupt", "ExceptionGroup", "BaseExceptionGroup",
              "StopIteration", "CancelledError", "NetfilterError"}
    bad = []
    for where, doc in _docstrings():
        section = re.split(r"\n\s*Raises:\s*\n", doc)
        if len(section) < 2:
            continue
        for line in section[1].splitlines():
            m = re.match(r"\s{0,8}([A-Z][A-Za-z]+):", line)
            if m and m.group(1) not in known:
                bad.append(f"{where}: {m.group(1)}")
    assert not bad, bad


def test_the_pytest_plugin_loads_without_hypothesis() -> None:
    """The plugin every pytest session loads needs no Hypothesis; the strategies do (the testing extra)."""
    code = ("import sys; sys.modules['hypothesis'] = None; import kproxy.testing.plugin, kproxy.testing; "
            "kproxy.testing.InProcessCluster\n"
            "try:\n    kproxy.testing.clusters\nexcept ImportError:\n    print('strategies need hypothesis')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "strategies need hypothesis"
