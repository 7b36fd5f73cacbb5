"""The JSON of the wire, read and written with orjson (a fifth of the standard library's cost), with
the standard library for what orjson refuses, so that everything is read and written as before:
admission's review bodies and answers (controller/admission/review.py), the API server's answers and
watch lines (controller/kube: the informers' first sync is mostly decoding, `decode_pruned`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import orjson


def decode(raw: bytes | str) -> Any:
    """A body's (or a line's) JSON. What orjson refuses (not JSON, but also what the standard library
    accepts and it does not: NaN, lone surrogates, UTF-16) goes to `json.loads`, which decides as it
    always did: ValueError (UnicodeDecodeError included) or RecursionError. An integer beyond 64 bits
    is read as a float (orjson 3.13): no field admission or the informers use holds one (the API
    server and Tekton read them as int32 or int64 and refuse more)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def is_object(value: Any) -> bool:
    """A JSON object: a dict (what `decode` gives, checked first) or any other Mapping. Admission asks this a
    dozen times a review, on the path a cold CPU runs (#24): `isinstance(value, Mapping)` alone goes
    through the ABC's `__instancecheck__` every time, a dict's type check is one comparison."""
    kind = type(value)
    return kind is dict or (value is not None and kind is not str and kind is not list and isinstance(value, Mapping))


def encode(value: Any) -> bytes:
    """Compact JSON (UTF-8). What orjson cannot write (integers beyond 64 bits, keys that are not
    strings) is written by `json.dumps`."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


# What a stored object may hold that no reader here reads: the API server keeps JSON nested up to 10,000
# deep, and a custom resource with unknown fields kept (a PipelineRun's custom task spec, which Tekton stores
# as it is) takes any value from its creator; both readers stop near 1,000 (orjson at 1,024, the standard
# library at the interpreter's recursion limit). Nothing egress-placer reads is more than a few levels deep.
PRUNED_DEPTH = 100
_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def decode_pruned(raw: bytes | str) -> Any:
    """`decode`, for what the API server stores (anyone's objects): a document nested deeper than the
    readers go is read with every value deeper than PRUNED_DEPTH as null (`prune`), rather than refused.
    So one tenant's object cannot stop an informer's list or watch."""
    try:
        return decode(raw)
    except RecursionError:
        return decode(prune(raw.encode() if isinstance(raw, str) else raw))


def prune(raw: bytes, depth: int = PRUNED_DEPTH) -> bytes:
    """`raw` with every array or object that opens deeper than `depth` replaced by null; the same bytes
    when nothing is that deep. Strings are skipped whole (escapes included), so brackets inside them do not
    count. Iterative: any depth. Not a validator: what is not JSON stays not JSON."""
    pieces: list[bytes] = []
    level, cut, last = 0, -1, 0
    for match in _STRING_OR_BRACKET.finditer(raw):
        token = raw[match.start()]
        if token == 0x22:  # a string
            continue
        if token in (0x5B, 0x7B):  # [ {
            level += 1
            if level > depth and cut < 0:
                cut = match.start()
        else:
            if cut >= 0 and level == depth + 1:
                pieces += (raw[last:cut], b"null")
                last, cut = match.end(), -1
            level -= 1
    if not pieces:
        return raw
    pieces.append(raw[last:])
    return b"".join(pieces)
