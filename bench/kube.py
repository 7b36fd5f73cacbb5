"""The benchmarks' load generator for the local cluster's API server: bulk creates, patches, lists,
collection deletes and watches, as plain JSON over aiohttp (a pinned dependency).

The product's client (`controller.kube.client`) finds the cluster: the address and the admin
credentials come from the cluster's kubeconfig through `make_api_client`, as for the controller and
the tests, and failed requests are retried by the one retry policy (`controller.retry`). Only
the HTTP path is the load generator's own: the product's client is synchronous, and the benchmarks
need hundreds of concurrent writes (a thread per request would compete with the measured processes
for the same two cores) and watch events timestamped as they arrive.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping

import aiohttp
import tenacity

from controller.kube.client import JSON, MERGE_PATCH, make_api_client
from controller.retry import RetryPolicy, retrying
from controller.settings import Settings
from devcluster.cluster import Cluster


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, text: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {text[:500]}")
        self.status = status


# Throttled (429) or a server error: tried 5 times in all, 0.2 s, 0.4 s, 0.8 s, 1 s apart.
_RETRY = retrying(
    RetryPolicy(attempts=5, initial=0.2, maximum=1.0, jitter=0.0),
    lambda e: isinstance(e, ApiError) and (e.status == 429 or e.status >= 500),
)


class Kube:
    """Use as `async with Kube(cluster) as kube:`."""

    def __init__(self, cluster: Cluster, connections: int = 32) -> None:
        configuration = make_api_client(Settings(kubeconfig=str(cluster.kubeconfig))).configuration
        self.base = configuration.host
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
        self._context = context
        self._connections = connections
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Kube":
        connector = aiohttp.TCPConnector(limit=self._connections, ssl=self._context)
        self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_read=120))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def request(self, method: str, path: str, body: Any = None, *, params: Mapping[str, Any] | None = None,
                      content_type: str = JSON, ok: Iterable[int] = ()) -> Any:
        """The JSON answer; raises ApiError on HTTP >= 400 unless the status is in `ok` (then None)."""
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        query = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (params or {}).items() if v is not None}
        retrying = tenacity.AsyncRetrying(retry=_RETRY.retry, wait=_RETRY.wait, stop=_RETRY.stop, reraise=True)
        try:
            return await retrying(self._send, method, path, data, query, content_type)
        except ApiError as e:
            if e.status in ok:
                return None
            raise

    async def _send(self, method: str, path: str, data: str | None, query: dict[str, str], content_type: str) -> Any:
        assert self.session is not None
        async with self.session.request(method, self.base + path, data=data, params=query,
                                        headers={"Content-Type": content_type, "Accept": JSON}) as response:
            text = await response.text()
            if response.status >= 400:
                raise ApiError(response.status, method, path, text)
            return json.loads(text) if text else None

    async def text(self, path: str) -> str:
        """A plain-text GET (e.g. /metrics)."""
        assert self.session is not None
        async with self.session.get(self.base + path) as response:
            if response.status >= 400:
                raise ApiError(response.status, "GET", path, await response.text())
            return await response.text()

    async def create(self, path: str, body: Mapping[str, Any], *, exist_ok: bool = False) -> Any:
        return await self.request("POST", path, body, ok=(409,) if exist_ok else ())

    async def get(self, path: str) -> Any:
        return await self.request("GET", path, ok=(404,))

    async def patch(self, path: str, body: Mapping[str, Any]) -> Any:
        return await self.request("PATCH", path, body, content_type=MERGE_PATCH)

    async def delete(self, path: str, **params: Any) -> Any:
        return await self.request("DELETE", path, params=params, ok=(404,))

    async def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
        """Every item (paginated) and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        token = None
        while True:
            page = await self.request("GET", path, params={**params, "limit": 500, "continue": token})
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items, page["metadata"].get("resourceVersion", "")

    async def watch(self, path: str, resource_version: str, **params: Any) -> AsyncIterator[tuple[float, str, dict[str, Any]]]:
        """(arrival time.monotonic(), type, object) for each event from `resource_version`."""
        assert self.session is not None
        query = {**{k: str(v) for k, v in params.items()}, "watch": "true", "resourceVersion": resource_version,
                 "allowWatchBookmarks": "false", "timeoutSeconds": "1800"}
        async with self.session.get(self.base + path, params=query) as response:
            if response.status >= 400:
                raise ApiError(response.status, "WATCH", path, await response.text())
            async for line in response.content:
                if line.strip():
                    event = json.loads(line)
                    yield time.monotonic(), event.get("type", ""), event.get("object") or {}


async def bounded(calls: Iterable[Callable[[], Awaitable[Any]]], concurrency: int) -> list[Any]:
    """Run the calls with at most `concurrency` at a time; results in order."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with semaphore:
            return await call()

    return await asyncio.gather(*(one(c) for c in calls))


async def ensure_namespace(kube: Kube, name: str, labels: Mapping[str, str] | None = None, timeout: float = 60) -> None:
    """Create the namespace (if absent) and wait for its `default` ServiceAccount (Tekton needs it)."""
    await kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": name, "labels": dict(labels or {})}}, exist_ok=True)
    deadline = time.monotonic() + timeout
    while await kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default") is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no default ServiceAccount in {name} after {timeout:.0f} s")
        await asyncio.sleep(0.2)
