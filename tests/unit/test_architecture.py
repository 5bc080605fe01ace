"""Architecture rules that keep the layers honest, checked on the source text."""

from __future__ import annotations

import ast
import builtins
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import kproxy
import kproxy.errors

ROOT = Path(__file__).resolve().parents[2]


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
