"""The tests' one client for the API server: `Api`, plain JSON through the controller's own `KubeApi`
(the same ApiClient, TLS and connection pool the product uses; objects are dicts, as the API server
sends them). The session fixture `api` (tests/conftest.py) is an admin one for the session's cluster;
`api_for(kubeconfig)` makes one for another identity.

    api.get(path)            the object, or None when it does not exist
    api.items(path, **query) a list's items
    api.create(path, body)   the created object
    api.merge_patch(path, body), api.json_patch(path, operations)
    api.delete(path, **query)  404 is fine: gone is gone
    api.text(path)           a plain-text GET (/metrics)

Other errors are the client's `ApiException` (with `.status`). Paths are the API's own
(`/api/v1/namespaces/NS/pods/NAME`); `pods(ns)` and friends spell the common ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from kubernetes.client.exceptions import ApiException

from controller.kube.client import JSON, JSON_PATCH, MERGE_PATCH, KubeApi, make_api_client
from controller.settings import Settings

Obj = dict[str, Any]
TEKTON = "/apis/tekton.dev/v1"


class Api(KubeApi):
    def get(self, path: str) -> Obj | None:
        try:
            return self.call("GET", path)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def items(self, path: str, **query: Any) -> list[Obj]:
        return list(self.call("GET", path, query=query).get("items") or [])

    def create(self, path: str, body: Mapping[str, Any], **query: Any) -> Obj:
        return self.call("POST", path, body=dict(body), query=query)

    def merge_patch(self, path: str, body: Mapping[str, Any]) -> Obj:
        return self.call("PATCH", path, body=dict(body), content_type=MERGE_PATCH)

    def json_patch(self, path: str, operations: Sequence[Mapping[str, Any]]) -> Obj:
        return self.call("PATCH", path, body=[dict(o) for o in operations], content_type=JSON_PATCH)

    def delete(self, path: str, **query: Any) -> None:
        try:
            self.call("DELETE", path, query=query)
        except ApiException as e:
            if e.status != 404:
                raise

    def text(self, path: str) -> str:
        response = self._send("GET", path, None, None, JSON, None, accept="text/plain")
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        return data.decode()


def api_for(kubeconfig: str | Path) -> Api:
    return Api(make_api_client(Settings(kubeconfig=str(kubeconfig))))


def namespaced(namespace: str, plural: str, name: str = "", group: str = "/api/v1") -> str:
    """`GROUP/namespaces/NS/PLURAL[/NAME]`: e.g. namespaced(ns, "pods", "p") or (ns, "taskruns", group=TEKTON)."""
    return f"{group}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


def pods(namespace: str, name: str = "") -> str:
    return namespaced(namespace, "pods", name)


def node(name: str = "") -> str:
    return "/api/v1/nodes" + (f"/{name}" if name else "")


def namespace(name: str = "") -> str:
    return "/api/v1/namespaces" + (f"/{name}" if name else "")


def namespaces_left(api: Api, *names: str) -> list[str]:
    """Of `names`, the namespaces still there, each with what it waits on (its deletion time and the
    conditions the namespace controller set: content or finalizers remaining, discovery failures...)."""
    left = []
    for name in names:
        found = api.get(namespace(name))
        if found is None:
            continue
        deleting = found["metadata"].get("deletionTimestamp")
        conditions = [f"{c['type']}: {c.get('message', '')}" for c in (found.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
        left.append(f"namespace {name} " + (f"terminating since {deleting} {conditions}" if deleting else "present"))
    return left
