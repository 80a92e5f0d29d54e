"""A minimal Kubernetes API server holding Secrets, for Helm's `lookup` during an upgrade.

Helm's template function `lookup "v1" "Secret" ns name` discovers the `v1` resources,
then GETs the object. This server answers exactly those two requests from a dict of
Secrets (404 for anything else), on 127.0.0.1 over plain HTTP, so the chart's "reuse
the existing certificate" branch can run against a real Helm engine without a cluster.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import helm_python

_CORE_RESOURCES = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": "v1",
    "resources": [
        {
            "name": "secrets",
            "singularName": "secret",
            "namespaced": True,
            "kind": "Secret",
            "verbs": ["get", "list"],
        }
    ],
}
_NOT_FOUND = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "reason": "NotFound",
    "code": 404,
}


class FakeKube(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        # (namespace, name) -> Secret object
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[str] = []

    def kubeconfig(self) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.server_port}"}}
                ],
                "users": [{"name": "fake", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )


class _Handler(BaseHTTPRequestHandler):
    server: FakeKube

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.server.requests.append(path)
        parts = path.strip("/").split("/")
        body: dict[str, Any] | None = None
        if path == "/api/v1":
            body = _CORE_RESOURCES
        elif len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "secrets":
            body = self.server.secrets.get((parts[3], parts[5]))
        self._reply(200 if body is not None else 404, body if body is not None else _NOT_FOUND)

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@contextmanager
def fake_cluster() -> Iterator[tuple[FakeKube, helm_python.Config]]:
    """A running FakeKube and a Helm configuration that talks to it."""
    server = FakeKube()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with helm_python.Config(kubeconfig_content=server.kubeconfig()) as config:
            yield server, config
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
