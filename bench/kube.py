"""A small asyncio client for the local cluster's API server (admin client certificate): bulk
creates, patches, lists, collection deletes and watches, as plain JSON over aiohttp.

The benchmarks need hundreds of concurrent writes and precise watch timestamps; the pinned
`kubernetes` client is synchronous, so this is aiohttp (a pinned dependency) with a bounded
number of connections.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping

import aiohttp

from devcluster.cluster import Cluster

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, text: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {text[:500]}")
        self.status = status


class Kube:
    """Use as `async with Kube(cluster) as kube:`."""

    def __init__(self, cluster: Cluster, connections: int = 32) -> None:
        self.base = cluster.api_url
        context = ssl.create_default_context(cafile=str(cluster.ca_file))
        admin = cluster.pki.dir / "admin"
        context.load_cert_chain(str(admin / "admin.crt"), str(admin / "admin.key"))
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
        assert self.session is not None
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        query = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (params or {}).items() if v is not None}
        for attempt in range(5):
            async with self.session.request(method, self.base + path, data=data, params=query,
                                            headers={"Content-Type": content_type, "Accept": JSON}) as response:
                text = await response.text()
                if response.status == 429 or (response.status >= 500 and attempt < 4):
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                if response.status >= 400:
                    if response.status in ok:
                        return None
                    raise ApiError(response.status, method, path, text)
                return json.loads(text) if text else None
        raise ApiError(503, method, path, "retries exhausted")

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
