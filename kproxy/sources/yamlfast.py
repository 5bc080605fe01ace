"""A faster YAML loader for manifests: libyaml's parser with a lean constructor, same results as PyYAML's.

``yaml.CSafeLoader`` parses and composes in C, but two pure-Python steps remain per node: the
resolver (which tag a plain scalar has: a regular expression per candidate tag) and the
``SafeConstructor`` (a generic object walk with a state machine for recursive structures). On
``kubectl get -o yaml`` output they are about two thirds of the load time. This loader keeps
the C parser and composer and changes only those two steps, without changing any result:

* the resolver's answer for a plain scalar depends only on its text (SafeLoader has no path
  resolvers), so it is computed once per distinct text and remembered for the document stream
  (a manifest repeats ``TCP``, ``true``, ``http`` ... thousands of times);
* documents are built by a direct walk: mappings into dicts, sequences into lists, strings kept,
  and every other scalar tag built by ``SafeConstructor``'s own method for it (``int``,
  ``float``, ``bool``, ``null``, ``timestamp``, ``binary``). Anything else (a merge key
  ``<<``, an explicit or unknown tag, an unhashable key, a recursive alias) makes that document
  go through the ordinary ``SafeConstructor``, so errors and edge cases are PyYAML's own.

Aliases resolve to the same object, as with PyYAML. Without libyaml the pure-Python
``SafeLoader`` is used unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = ["load_all"]

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_BUILDERS = {
    "tag:yaml.org,2002:int": "construct_yaml_int",
    "tag:yaml.org,2002:float": "construct_yaml_float",
    "tag:yaml.org,2002:bool": "construct_yaml_bool",
    "tag:yaml.org,2002:null": "construct_yaml_null",
    "tag:yaml.org,2002:timestamp": "construct_yaml_timestamp",
    "tag:yaml.org,2002:binary": "construct_yaml_binary",
}


class _Fallback(Exception):
    """The document needs the ordinary constructor."""


_CLoader: Any = getattr(yaml, "CSafeLoader", None)


# resolve() below answers a quoted scalar, a mapping and a sequence with the default tags, which
# holds only while no path resolver is registered (SafeLoader registers none).
if _CLoader is not None and not _CLoader.yaml_path_resolvers:

    class _FastLoader(_CLoader):  # type: ignore[misc]
        """CSafeLoader with a remembering resolver and a direct constructor (module docstring)."""

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._plain: dict[str, str] = {}
            self._scalar: dict[str, Callable[[ScalarNode], Any]] = {
                tag: getattr(self, name) for tag, name in _BUILDERS.items()}

        def resolve(self, kind: type[Node], value: Any, implicit: Any) -> str:
            if kind is ScalarNode:
                if implicit[0]:
                    tag = self._plain.get(value)
                    if tag is None:
                        tag = self._plain[value] = super().resolve(kind, value, implicit)
                    return tag
                return _STR
            return _MAP if kind is MappingNode else _SEQ

        def construct_document(self, node: Node) -> Any:
            try:
                return self._build(node, {})
            except _Fallback:
                return super().construct_document(node)

        def _build(self, node: Node, memo: dict[int, Any]) -> Any:
            cls = node.__class__
            if cls is ScalarNode:
                tag = node.tag
                if tag == _STR:
                    return node.value
                builder = self._scalar.get(tag)
                if builder is None:
                    raise _Fallback
                return builder(node)  # type: ignore[arg-type]
            key = id(node)
            if key in memo:
                done = memo[key]
                if done is _IN_PROGRESS:
                    raise _Fallback  # a recursive alias
                return done
            memo[key] = _IN_PROGRESS
            if cls is MappingNode and node.tag == _MAP:
                out: Any = {}
                for key_node, value_node in node.value:
                    if key_node.tag == _STR:
                        k = key_node.value
                    else:
                        if key_node.__class__ is not ScalarNode or key_node.tag == "tag:yaml.org,2002:merge":
                            raise _Fallback
                        k = self._build(key_node, memo)
                        try:
                            hash(k)
                        except TypeError:
                            raise _Fallback from None
                    out[k] = self._build(value_node, memo)
            elif cls is SequenceNode and node.tag == _SEQ:
                out = [self._build(item, memo) for item in node.value]
            else:
                raise _Fallback
            memo[key] = out
            return out

    _LOADER: Any = _FastLoader
else:  # pragma: no cover - PyYAML built without libyaml
    _LOADER = yaml.SafeLoader if _CLoader is None else _CLoader

_IN_PROGRESS = object()


def load_all(text: str) -> Iterator[Any]:
    """Every document of a YAML stream, exactly as ``yaml.load_all(text, yaml.CSafeLoader)`` gives them.

    Raises:
        yaml.YAMLError: the text is not valid YAML (PyYAML's error, with its mark).
    """
    return iter(yaml.load_all(text, _LOADER))
