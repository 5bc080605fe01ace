"""The public surface of kproxy.sources and kproxy.sync: exported, importable and documented."""

from __future__ import annotations

import builtins
import importlib
import inspect
import re

import pytest

import kproxy.errors

MODULES = ["kproxy.sources", "kproxy.sync"]


def _public_objects(module_name: str) -> list[tuple[str, object]]:
    module = importlib.import_module(module_name)
    return [(name, getattr(module, name)) for name in module.__all__
            if inspect.isclass(getattr(module, name)) or inspect.isfunction(getattr(module, name))]


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_class_and_function_has_a_docstring(module_name: str) -> None:
    """Each class and function in __all__ resolves and has a docstring."""
    for name, value in _public_objects(module_name):
        assert (inspect.getdoc(value) or "").strip(), f"{module_name}.{name} has no docstring"


@pytest.mark.parametrize("module_name", MODULES)
def test_raises_sections_name_real_exceptions(module_name: str) -> None:
    """Every exception under a docstring's Raises: exists in kproxy.errors or the builtins."""
    known = set(kproxy.errors.__all__) | {n for n in dir(builtins) if n.endswith(("Error", "Group"))}
    docs: list[tuple[str, str]] = []
    for name, value in _public_objects(module_name):
        docs.append((name, inspect.getdoc(value) or ""))
        if inspect.isclass(value):
            docs.extend((f"{name}.{m}", inspect.getdoc(f) or "") for m, f in vars(value).items()
                        if inspect.isfunction(f))
    for where, doc in docs:
        for block in re.findall(r"Raises:\n((?:    .*\n?|\n)+)", doc):
            for exc in re.findall(r"^    (\w+):", block, flags=re.MULTILINE):
                assert exc in known, f"{module_name}.{where} documents unknown exception {exc}"
