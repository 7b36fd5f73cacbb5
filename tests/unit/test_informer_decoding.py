"""The informers read the API server's JSON with the wire's decoder (controller/core/json_wire.py:
orjson, the standard library for what it refuses; a document nested deeper than both read is read
pruned, `decode_pruned`), and keep glibc from holding on to the large buffers a list page is parsed
into (`fixed_mmap_threshold`, set when the informers start)."""

from __future__ import annotations

import json
import platform
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.json_wire import decode, decode_pruned, is_object, prune
from controller.kube import client, informer


def test_the_informer_and_the_client_decode_with_the_wires_pruning_decoder() -> None:
    assert informer.decode_pruned is decode_pruned and client.decode_pruned is decode_pruned


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_mmap_threshold_is_fixed_where_there_is_glibc() -> None:
    assert informer.fixed_mmap_threshold() is True


# Strings that look like JSON's structure: brackets, quotes and backslashes inside them are text.
TEXT = st.text(alphabet=st.sampled_from(list('ab[]{}",:\\ é\n\t\u2028')), max_size=8)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), TEXT)
DOCUMENTS = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
                         max_leaves=40)


def pruned(value: Any, depth: int, level: int = 0) -> Any:
    """What `prune` should give, on the parsed value: every array or object opening deeper than `depth`
    is None."""
    if isinstance(value, (list, dict)):
        if level + 1 > depth:
            return None
        if isinstance(value, list):
            return [pruned(v, depth, level + 1) for v in value]
        return {k: pruned(v, depth, level + 1) for k, v in value.items()}
    return value


@settings(max_examples=400, deadline=None)
@given(document=DOCUMENTS, depth=st.integers(0, 6), ascii_only=st.booleans())
def test_pruning_replaces_exactly_what_opens_too_deep(document: Any, depth: int, ascii_only: bool) -> None:
    raw = json.dumps(document, ensure_ascii=ascii_only).encode()
    assert json.loads(prune(raw, depth)) == pruned(document, depth)
    assert prune(raw, 100) == raw  # nothing that deep: the same bytes


@pytest.mark.parametrize("nest", [100_000])  # past any recursion limit the suite may run under
def test_a_document_too_deep_for_both_readers_is_read_pruned_with_its_siblings(nest: int) -> None:
    # A PipelineRun whose custom task spec its creator nested (the API server stores up to 10,000 deep).
    raw = ('{"metadata":{"name":"deep","annotations":{"a":"[[[{"}},"spec":{"x":' + "[" * nest + '"y"' + "]" * nest + '},"n":1}').encode()
    with pytest.raises(RecursionError):
        decode(raw)
    out = decode_pruned(raw)
    assert out["metadata"] == {"name": "deep", "annotations": {"a": "[[[{"}} and out["n"] == 1
    value, level = out["spec"]["x"], 2
    while isinstance(value, list):
        value, level = value[0], level + 1
    assert value is None and level == 100  # the deepest list kept opened 100 levels down; the next is null


def test_what_is_not_json_stays_refused() -> None:
    with pytest.raises((ValueError, RecursionError)):
        decode_pruned(b"[" * 5000 + b"oops")
    with pytest.raises(ValueError):
        decode_pruned(b"[" * 5000 + b"1" + b"]" * 4999 + b"}")


class _Frozen(Mapping):  # a Mapping that is not a dict (a read-only view some callers pass)
    def __init__(self, items: dict[str, Any]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@pytest.mark.parametrize(
    "value, expected",
    [
        ({}, True),
        ({"a": 1}, True),
        (_Frozen({"a": 1}), True),
        (MappingProxyType({"a": 1}), True),
        (None, False),
        ("text", False),
        ([], False),
        ([{"a": 1}], False),
        ((), False),
        (0, False),
        (b"{}", False),
    ],
)
def test_is_object_answers_as_the_mapping_check_did(value: Any, expected: bool) -> None:
    """`is_object`, admission's fast form of `isinstance(value, Mapping)`, answers exactly as that check."""
    assert is_object(value) is expected is isinstance(value, Mapping)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_is_object_agrees_with_the_mapping_check_on_any_decoded_value(value: Any) -> None:
    assert is_object(value) is isinstance(value, Mapping)
