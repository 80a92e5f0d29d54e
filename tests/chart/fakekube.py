"""A stand-in for the Kubernetes API server, on 127.0.0.1 over plain HTTP.

It answers the requests the project makes (Helm's `lookup`, the `burstbuffer` CLI)
the way the real API server does, with the same paths, JSON and status codes:

- discovery of `v1`; GET of one object; GET of a namespace's list or of every
  namespace's (`PodList`...; items carry no kind/apiVersion, as in the real lists);
- errors as `Status` objects: 404 NotFound (`pods "x" not found`), 403 Forbidden for
  the verbs listed in `forbidden` (`User "tester" cannot get resource ...`), 400
  BadRequest, 503 ServiceUnavailable, 500 InternalError;
- POST of a Pod (with `dryRun=All` it is not stored): the mutating webhooks of the
  stored MutatingWebhookConfigurations are called as the API server calls them (their
  namespace and object selectors, an AdmissionReview over TLS verified with the caBundle
  for `<service>.<namespace>.svc`, failurePolicy), and the pod comes back patched (their
  `rules` are taken to match: the chart's select exactly pod creation);
- the pod proxy, `pods/NAME:PORT/proxy/PATH`, forwarded to the pod's port.

Addresses: a pod IP stands for 127.0.0.1 (the test's processes listen there; loopback
pod IPs are refused, as by the real proxy); a Service is reached at the 127.0.0.1 port
given in `endpoints`. Objects are stored as given, with the metadata the API server adds.
"""

from __future__ import annotations

import base64
import copy
import http.client
import ipaddress
import itertools
import json
import re
import secrets
import socket
import ssl
import threading
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import helm_python

from tests.chart.helmchart import selector_matches
from tests.injector.podcheck import admission_review, apply, decoded_patch

USER = "tester"
# kind -> (API prefix, resource, namespaced)
KINDS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Pod": ("/api/v1", "pods", True),
    "Secret": ("/api/v1", "secrets", True),
    "Service": ("/api/v1", "services", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
}
_BY_RESOURCE = {(prefix, resource): kind for kind, (prefix, resource, _) in KINDS.items()}
_PATH = re.compile(
    r"^(?P<prefix>/api/v1|/apis/[^/]+/[^/]+)(?:/namespaces/(?P<namespace>[^/]+))?"
    r"/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<subresource>[^/]+)(?P<rest>/.*)?)?)?$"
)


class ApiStatus(Exception):
    """An error the API server answers with a Status object."""

    def __init__(self, code: int, reason: str, message: str, **details: str) -> None:
        super().__init__(message)
        self.status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
        if details:
            self.status["details"] = details


class FakeKube(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[str, dict[str, Any]] = {}
        # "verb resource" pairs refused with 403, e.g. "get secrets", "get pods/proxy".
        self.forbidden: set[str] = set()
        # (namespace, service name) -> the 127.0.0.1 port its endpoints listen on.
        self.endpoints: dict[tuple[str, str], int] = {}
        self.requests: list[str] = []
        self._serial = itertools.count(1)
        self._lock = threading.Lock()

    def kubeconfig(self, namespace: str | None = None) -> str:
        context: dict[str, str] = {"cluster": "fake", "user": "fake"}
        if namespace:
            context["namespace"] = namespace
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.server_port}"}}
                ],
                "users": [{"name": "fake", "user": {}}],
                "contexts": [{"name": "fake", "context": context}],
                "current-context": "fake",
            }
        )

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store `obj` (replacing one of the same name) with the API server's metadata."""
        stored = copy.deepcopy(dict(obj))
        metadata = stored.setdefault("metadata", {})
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        metadata["resourceVersion"] = str(next(self._serial))
        if stored["kind"] == "Namespace":
            labels = metadata.setdefault("labels", {})
            labels["kubernetes.io/metadata.name"] = metadata["name"]
        with self._lock:
            self.objects[path_of(stored)] = stored
        return stored

    def get(self, path: str) -> dict[str, Any] | None:
        with self._lock:
            return self.objects.get(path)

    def of_kind(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            found = [o for o in self.objects.values() if o["kind"] == kind]
        if namespace is not None:
            found = [o for o in found if o["metadata"].get("namespace") == namespace]
        return sorted(
            found, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
        )


def path_of(obj: Mapping[str, Any]) -> str:
    prefix, resource, namespaced = KINDS[obj["kind"]]
    metadata = obj["metadata"]
    scope = f"/namespaces/{metadata['namespace']}" if namespaced else ""
    return f"{prefix}{scope}/{resource}/{metadata['name']}"


def _group(prefix: str) -> str:
    return "" if prefix == "/api/v1" else prefix.split("/")[2]


def _qualified(prefix: str, resource: str) -> str:
    group = _group(prefix)
    return f"{resource}.{group}" if group else resource


def _not_found(prefix: str, resource: str, name: str) -> ApiStatus:
    details = {"name": name, "kind": resource}
    if _group(prefix):
        details["group"] = _group(prefix)
    message = f'{_qualified(prefix, resource)} "{name}" not found'
    return ApiStatus(404, "NotFound", message, **details)


class _Handler(BaseHTTPRequestHandler):
    server: FakeKube
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer("get")

    def do_POST(self) -> None:
        self._answer("create")

    def _answer(self, verb: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.server.requests.append(url.path)
        query = urllib.parse.parse_qs(url.query)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            if url.path == "/api/v1" and verb == "get":
                self._json(200, _core_resources())
                return
            match = _PATH.match(url.path)
            if match is None or (match["prefix"], match["resource"]) not in _BY_RESOURCE:
                raise ApiStatus(404, "NotFound", "the server could not find the requested resource")
            parts = {k: urllib.parse.unquote(v) if v else v for k, v in match.groupdict().items()}
            if verb == "get" and parts["subresource"] == "proxy" and parts["resource"] == "pods":
                self._proxy(parts, url.query)
            elif verb == "get":
                self._json(200, self._read(parts))
            elif parts["resource"] == "pods" and parts["name"] is None:
                self._json(201, self._create_pod(parts, json.loads(body), query))
            else:
                raise ApiStatus(405, "MethodNotAllowed", "the server does not allow this method")
        except ApiStatus as e:
            self._json(e.status["code"], e.status)

    def _refuse(self, verb: str, parts: Mapping[str, Any], resource: str) -> None:
        if f"{verb} {resource}" not in self.server.forbidden:
            return
        namespace = parts["namespace"]
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        subject = _qualified(parts["prefix"], parts["resource"])
        if parts["name"] and verb == "get":
            subject += f' "{parts["name"]}"'
        message = (
            f'{subject} is forbidden: User "{USER}" cannot {verb} resource "{resource}" '
            f'in API group "{_group(parts["prefix"])}" {where}'
        )
        raise ApiStatus(403, "Forbidden", message, name=parts["name"] or "", kind=parts["resource"])

    def _read(self, parts: Mapping[str, Any]) -> dict[str, Any]:
        prefix, resource, name = parts["prefix"], parts["resource"], parts["name"]
        kind = _BY_RESOURCE[(prefix, resource)]
        if name is None:
            self._refuse("list", parts, resource)
            items = []
            for obj in self.server.of_kind(kind, parts["namespace"]):
                item = copy.deepcopy(obj)
                item.pop("kind")
                item.pop("apiVersion", None)
                items.append(item)
            metadata = {"resourceVersion": str(next(self.server._serial))}
            return {
                "kind": f"{kind}List",
                "apiVersion": prefix.split("/", 2)[2],
                "metadata": metadata,
                "items": items,
            }
        self._refuse("get", parts, resource)
        scope = f"/namespaces/{parts['namespace']}" if parts["namespace"] else ""
        found = self.server.get(f"{prefix}{scope}/{resource}/{name}")
        if found is None:
            raise _not_found(prefix, resource, name)
        return found

    def _proxy(self, parts: Mapping[str, Any], query: str) -> None:
        self._refuse("get", parts, "pods/proxy")
        fields = parts["name"].split(":")
        name, port = fields[-2] if len(fields) > 1 else fields[0], fields[-1]
        pod = self.server.get(f"/api/v1/namespaces/{parts['namespace']}/pods/{name}")
        if pod is None:
            raise _not_found("/api/v1", "pods", name)
        pod_ip = pod.get("status", {}).get("podIP", "")
        try:
            address = ipaddress.ip_address(pod_ip)
        except ValueError:
            address = None
        if address is None or address.is_loopback or address.is_link_local:
            raise ApiStatus(400, "BadRequest", "address not allowed")
        target = (parts["rest"] or "/") + (f"?{query}" if query else "")
        connection = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
        try:
            connection.request("GET", target)
            response = connection.getresponse()
            payload = response.read()
        except OSError as e:
            reason = (
                "connect: connection refused" if isinstance(e, ConnectionRefusedError) else str(e)
            )
            message = f"error trying to reach service: dial tcp {pod_ip}:{port}: {reason}"
            raise ApiStatus(503, "ServiceUnavailable", message) from None
        finally:
            connection.close()
        self._send(response.status, response.getheader("Content-Type", "text/plain"), payload)

    def _create_pod(
        self, parts: Mapping[str, Any], pod: dict[str, Any], query: Mapping[str, list[str]]
    ) -> dict[str, Any]:
        self._refuse("create", parts, "pods")
        namespace = parts["namespace"]
        found = self.server.get(f"/api/v1/namespaces/{namespace}")
        if found is None:
            raise _not_found("/api/v1", "namespaces", namespace)
        metadata = pod.setdefault("metadata", {})
        metadata["namespace"] = namespace
        if not metadata.get("name"):
            alphabet = "bcdfghjklmnpqrstvwxz2456789"
            suffix = "".join(secrets.choice(alphabet) for _ in range(5))
            metadata["name"] = metadata.get("generateName", "") + suffix
        for configuration in self.server.of_kind("MutatingWebhookConfiguration"):
            for hook in configuration.get("webhooks") or []:
                if selector_matches(
                    hook.get("namespaceSelector"), found["metadata"]["labels"]
                ) and selector_matches(hook.get("objectSelector"), metadata.get("labels") or {}):
                    pod = self._call_webhook(hook, pod, namespace)
        pod = {"apiVersion": "v1", "kind": "Pod", **pod}
        if query.get("dryRun") == ["All"]:
            metadata = pod["metadata"]
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            return pod
        return self.server.put(pod)

    def _call_webhook(
        self, hook: Mapping[str, Any], pod: dict[str, Any], namespace: str
    ) -> dict[str, Any]:
        """The pod after one webhook, as the API server calls it; failurePolicy on errors."""
        service = hook["clientConfig"]["service"]
        host = f"{service['name']}.{service['namespace']}.svc"
        timeout = int(hook.get("timeoutSeconds", 10))
        target = f"{service.get('path', '/')}?timeout={timeout}s"
        url = f"https://{host}:{service.get('port', 443)}{target}"
        try:
            port = self.server.endpoints.get((service["namespace"], service["name"]))
            if port is None:
                raise OSError(f'no endpoints available for service "{service["name"]}"')
            bundle = base64.b64decode(hook["clientConfig"].get("caBundle", "")).decode()
            context = ssl.create_default_context(cadata=bundle or None)
            # Verified for the Service's DNS name, as the API server does, whatever address.
            raw = socket.create_connection(("127.0.0.1", port), timeout)
            connection = http.client.HTTPConnection(host, timeout=timeout)
            connection.sock = context.wrap_socket(raw, server_hostname=host)
            review = admission_review(pod, namespace)
            review["request"]["dryRun"] = True
            connection.request(
                "POST",
                target,
                body=json.dumps(review),
                headers={"Content-Type": "application/json"},
            )
            answer = json.loads(connection.getresponse().read())["response"]
            connection.close()
        except (OSError, ValueError, KeyError) as e:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                return pod
            message = (
                f'Internal error occurred: failed calling webhook "{hook["name"]}": '
                f'failed to call webhook: Post "{url}": {e}'
            )
            raise ApiStatus(500, "InternalError", message) from None
        if not answer.get("allowed"):
            result = answer.get("status") or {}
            message = f'admission webhook "{hook["name"]}" denied the request: '
            message += str(result.get("message", ""))
            raise ApiStatus(int(result.get("code") or 400), "BadRequest", message)
        return apply(pod, decoded_patch(answer))

    def _json(self, status: int, body: Mapping[str, Any]) -> None:
        self._send(status, "application/json", json.dumps(body).encode())

    def _send(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def _core_resources() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "v1",
        "resources": [
            {
                "name": resource,
                "singularName": kind.lower(),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": ["create", "get", "list"],
            }
            for kind, (prefix, resource, namespaced) in KINDS.items()
            if prefix == "/api/v1"
        ],
    }


@contextmanager
def running() -> Iterator[FakeKube]:
    """A FakeKube serving on a thread until the block ends."""
    server = FakeKube()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def fake_cluster() -> Iterator[tuple[FakeKube, helm_python.Config]]:
    """A running FakeKube and a Helm configuration that talks to it."""
    with running() as server:
        with helm_python.Config(kubeconfig_content=server.kubeconfig()) as config:
            yield server, config
