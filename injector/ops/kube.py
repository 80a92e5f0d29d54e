"""The API calls `burstbuffer` makes, on the `kubernetes` client, as plain dicts.

Every answer is the API server's JSON parsed as is (`_preload_content=False`): the
client's typed models drop fields their version does not know, and the decisions in
`status` and `check` read plain dicts, as `injector.mutate` does. An error Status
becomes `ApiError` (its code, reason and message); an API server that cannot be
configured or reached becomes `ConnectError`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException, OpenApiException
from kubernetes.config.config_exception import ConfigException

# Where a pod finds its namespace when the CLI runs in-cluster.
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ConnectError(Exception):
    """No usable kubeconfig or in-cluster configuration, or the API server did not answer."""


class ApiError(Exception):
    """The API server answered with an error Status."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Target:
    """Which cluster to talk to, and as whom (the kubeconfig flags)."""

    kubeconfig: str | None
    context: str | None
    timeout: float  # seconds for one API request


class Kube:
    """One API server, reached with one configuration; `close()` when done."""

    def __init__(self, api_client: client.ApiClient, namespace: str, timeout: float) -> None:
        self._client = api_client
        self._core = client.CoreV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)
        self._admission = client.AdmissionregistrationV1Api(api_client)
        # The namespace of the kubeconfig context (or of the pod, in-cluster).
        self.namespace = namespace
        self.server = api_client.configuration.host
        self._timeout = timeout

    def close(self) -> None:
        self._client.close()

    def list_pods(self, namespace: str | None) -> list[dict[str, Any]]:
        """The pods of `namespace`, or of every namespace when None."""
        if namespace is None:
            pods = self._call(self._core.list_pod_for_all_namespaces)
        else:
            pods = self._call(self._core.list_namespaced_pod, namespace)
        return list(pods.get("items") or [])

    def pod_proxy_get(self, namespace: str, pod: str, port: int, path: str) -> dict[str, Any]:
        """GET `path` from `pod`'s `port` through the API server's pod proxy, as JSON."""
        return self._call(
            self._core.connect_get_namespaced_pod_proxy_with_path, f"{pod}:{port}", namespace, path
        )

    def namespace_object(self, name: str) -> dict[str, Any]:
        return self._call(self._core.read_namespace, name)

    def secret(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self._core.read_namespaced_secret, name, namespace)

    def deployment(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self._apps.read_namespaced_deployment, name, namespace)

    def mutating_webhook_configuration(self, name: str) -> dict[str, Any]:
        return self._call(self._admission.read_mutating_webhook_configuration, name)

    def dry_run_create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        """The pod as the API server would store it (admission included), not stored."""
        return self._call(self._core.create_namespaced_pod, namespace, pod, dry_run="All")

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            response = method(
                *args, _preload_content=False, _request_timeout=self._timeout, **kwargs
            )
        except ApiException as e:
            raise _api_error(e) from None
        except urllib3.exceptions.HTTPError as e:
            raise ConnectError(f"the API server at {self.server} did not answer: {e}") from None
        try:
            document = json.loads(response.data)
        except ValueError:
            raise ApiError(response.status, "BadResponse", "the answer is not JSON") from None
        if not isinstance(document, dict):
            raise ApiError(response.status, "BadResponse", "the answer is not a JSON object")
        return document


def _api_error(e: ApiException) -> ApiError:
    """The Status the API server sent (or what the proxied server said, or the HTTP reason)."""
    body = e.body.decode(errors="replace") if isinstance(e.body, bytes) else (e.body or "")
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("kind") == "Status":
        return ApiError(
            int(status.get("code") or e.status), status.get("reason", ""), status.get("message", "")
        )
    # A proxied server's own error page: its first line is the most telling part.
    first_line = body.strip().splitlines()[0] if body.strip() else (e.reason or "")
    return ApiError(int(e.status or 0), e.reason or "", first_line[:200])


def connect(target: Target) -> Kube:
    """A client from the kubeconfig (`--kubeconfig`, else $KUBECONFIG or ~/.kube/config),
    or the in-cluster service account when there is no kubeconfig, as kubectl does."""
    configuration = client.Configuration()
    try:
        if target.kubeconfig is not None or _default_kubeconfig_exists():
            config.load_kube_config(
                config_file=target.kubeconfig,
                context=target.context,
                client_configuration=configuration,
                persist_config=False,
            )
            namespace = _context_namespace(target)
        else:
            if target.context is not None:
                raise ConnectError(f"--context {target.context}: no kubeconfig to find it in")
            try:
                config.load_incluster_config(client_configuration=configuration)
            except ConfigException as e:
                where = config.KUBE_CONFIG_DEFAULT_LOCATION
                raise ConnectError(f"no kubeconfig ({where}) and not in a cluster: {e}") from None
            namespace = _SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except (ConfigException, OpenApiException, OSError) as e:
        where = target.kubeconfig or config.KUBE_CONFIG_DEFAULT_LOCATION
        raise ConnectError(f"no usable cluster configuration ({where}): {e}") from None
    return Kube(client.ApiClient(configuration), namespace or "default", target.timeout)


def _default_kubeconfig_exists() -> bool:
    # $KUBECONFIG may list several files, as for kubectl.
    paths = config.KUBE_CONFIG_DEFAULT_LOCATION.split(os.pathsep)
    return any(Path(path).expanduser().exists() for path in paths if path)


def _context_namespace(target: Target) -> str:
    contexts, current = config.list_kube_config_contexts(target.kubeconfig)
    chosen = current
    if target.context is not None:
        chosen = next((c for c in contexts if c.get("name") == target.context), current)
    return str((chosen or {}).get("context", {}).get("namespace") or "")
