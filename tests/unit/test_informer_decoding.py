"""The informers read the API server's JSON with the wire's decoder (controller/core/json_wire.py:
orjson, the standard library for what it refuses), and keep glibc from holding on to the large
buffers a list page is parsed into (`fixed_mmap_threshold`, set when the informers start)."""

from __future__ import annotations

import platform

import pytest

from controller.core.json_wire import decode
from controller.kube import client, informer


def test_the_informer_and_the_client_decode_with_the_wires_decoder() -> None:
    assert informer.decode is decode and client.decode is decode


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_mmap_threshold_is_fixed_where_there_is_glibc() -> None:
    assert informer.fixed_mmap_threshold() is True
