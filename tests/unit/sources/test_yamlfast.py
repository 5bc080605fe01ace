"""The fast manifest loader gives exactly what PyYAML's CSafeLoader gives, errors included."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.sources.yamlfast import load_all

CSAFE: Any = yaml.CSafeLoader


def _both(text: str) -> tuple[list[Any], list[Any]]:
    return list(yaml.load_all(text, CSAFE)), list(load_all(text))


@pytest.mark.parametrize("text", [
    "a: 1\nb: 0x1f\nc: 0o17\nd: 1_000\ne: 1:30\nf: 3.5\ng: .inf\nh: -.Inf\ni: .nan\n",
    "yes: no\non: off\nTrue: FALSE\nn: ~\nm: null\nempty:\n",
    "t: 2024-05-01T10:00:00Z\nd: 2024-05-01\nq: '2024-05-01'\n",
    "anchor: &a {x: 1, y: [1, 2]}\nalias: *a\nlist: [*a, *a]\n",
    "base: &b {x: 1, y: 2}\nmerged:\n  <<: *b\n  y: 3\n",
    "1: int key\n2.5: float key\nnull: null key\n",
    "tagged: !!str 42\nnum: !!int '7'\nbin: !!binary aGVsbG8=\nset: !!set {a, b}\n",
    "recursive: &r [1, *r]\n",
    "---\na: 1\n---\n---\n- x\n- y\n...\n",
    "kind: Service\nmetadata: {name: web, labels: {app: web}}\nspec:\n  ports:\n  - {port: 80, name: ''}\n",
    "key: 'quoted: true'\nother: \"0x10\"\nplain: 0x10\n",
])
def test_special_documents_load_as_pyyaml_loads_them(text: str) -> None:
    """Ints in every base, YAML 1.1 booleans, timestamps, anchors, merge keys, complex and non-string
    keys, explicit tags, recursion and several documents: the same values and types."""
    slow, fast = _both(text)
    assert repr(fast) == repr(slow)


def test_aliases_are_the_same_object_as_in_pyyaml() -> None:
    """An alias is the very object its anchor built, as PyYAML gives it."""
    (doc,) = load_all("a: &x {k: v}\nb: *x\n")
    assert doc["a"] is doc["b"]
    (rec,) = load_all("r: &r [1, *r]\n")
    assert rec["r"][1] is rec["r"]


@pytest.mark.parametrize("text", ["a: [1, 2\n", "a: b: c\n", "x: !!python/object:os.system ls\n",
                                  "[1, 2]: unhashable\n", "? [1, 2]\n: complex key\n", "a: 1\na: *missing\n"])
def test_invalid_documents_raise_pyyaml_s_own_error(text: str) -> None:
    """A syntax error, an unsafe tag, an unhashable key or an unknown alias raises what CSafeLoader raises."""
    with pytest.raises(yaml.YAMLError) as slow:
        list(yaml.load_all(text, CSAFE))
    with pytest.raises(yaml.YAMLError) as fast:
        list(load_all(text))
    assert type(fast.value) is type(slow.value) and str(fast.value) == str(slow.value)


_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
            | st.text(max_size=12) | st.dates() | st.datetimes(timezones=st.just(datetime.UTC)))
_keys = st.text(max_size=8) | st.integers()
_keys = st.text(max_size=8) | st.integers()
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(_keys, inner, max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(_values, st.booleans(), st.sampled_from([None, "'", '"']))
def test_any_dumped_document_loads_as_pyyaml_loads_it(value: Any, flow: bool, style: str | None) -> None:
    """Whatever PyYAML dumps (block or flow, plain or quoted scalars) loads to the same value."""
    text = yaml.safe_dump_all([value, {"doc": value}], default_flow_style=flow, default_style=style)
    slow, fast = _both(text)
    assert repr(fast) == repr(slow)
