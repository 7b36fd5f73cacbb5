"""The JSON of the wire, read and written with orjson (a fifth of the standard library's cost), with
the standard library for what orjson refuses, so that everything is read and written as before:
admission's review bodies and answers (controller/admission/review.py), the API server's answers and
watch lines (controller/kube: the informers' first sync is mostly decoding)."""

from __future__ import annotations

import json
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


def encode(value: Any) -> bytes:
    """Compact JSON (UTF-8). What orjson cannot write (integers beyond 64 bits, keys that are not
    strings) is written by `json.dumps`."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()

