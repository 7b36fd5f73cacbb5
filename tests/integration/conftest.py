"""Fixtures for the adapter's integration tests on the local cluster: an admin `KubeApi` (the
adapter's own plain-JSON client) and a fresh namespace per test, deleted afterwards."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from controller.kube.client import KubeApi, make_api_client
from controller.settings import Settings


@pytest.fixture(scope="module")
def api(devcluster) -> KubeApi:
    return KubeApi(make_api_client(Settings(kubeconfig=str(devcluster.kubeconfig))))


@pytest.fixture
def namespace(api: KubeApi) -> Iterator[str]:
    name = f"itest-{uuid.uuid4().hex[:8]}"
    api.call("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    yield name
    api.call("DELETE", f"/api/v1/namespaces/{name}")
