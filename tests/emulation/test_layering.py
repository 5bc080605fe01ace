"""The emulator's modules import one way: no cycles (not even for type checking), no late imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "emulation"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _edges(name: str) -> set[str]:
    """The emulation modules ``name`` imports, at any level (``from pkg import mod`` is ``pkg.mod``)."""
    tree = ast.parse(MODULES[name].read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in MODULES else node.module)
    return {m for m in out if m in MODULES and m != name}


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, trail = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return [*trail, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*trail, nxt]))
    return None


def test_no_import_cycles() -> None:
    """No module of ``emulation`` reaches itself through imports (``TYPE_CHECKING`` ones included);
    a package's ``__init__`` re-exporting its submodules is not counted against them."""
    graph = {name: _edges(name) for name in MODULES}
    for name in MODULES:  # a submodule importing its own package's __init__ is the usual re-export
        graph[name] = {m for m in graph[name] if not name.startswith(f"{m}.")}
    cycles = [c for c in (_cycle_from(n, graph) for n in MODULES) if c is not None]
    assert not cycles, cycles[0]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_are_at_module_level(name: str) -> None:
    """No import hides inside a function (the usual way to dodge a cycle), nor under ``TYPE_CHECKING``."""
    tree = ast.parse(MODULES[name].read_text())
    late = [
        node.lineno
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.If)
        for node in ast.walk(fn)
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    assert not late, f"{name}: imports at lines {late}"


def test_the_reference_walk_does_not_import_the_accelerator() -> None:
    """``accel`` builds on the reference semantics; nothing below it imports it."""
    graph = {name: _edges(name) for name in MODULES}
    users = sorted(
        n
        for n, deps in graph.items()
        if not n.startswith("emulation.netfilter.accel")
        and n not in ("emulation.netfilter", "emulation.netfilter.netns")
        and any(d.startswith("emulation.netfilter.accel") for d in deps)
    )
    assert not users
