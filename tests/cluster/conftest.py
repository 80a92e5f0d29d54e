"""The one-node cluster as a fixture, and what the tests on it share.

The cluster is started once per session (or reused when `make cluster` left one running,
which is then left running); each test gets namespaces of its own, deleted at its end.
Every wait polls the API server with a deadline. The chart is installed by the tests
that need it, with the images `make cluster` imported under the chart's default names.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from kubernetes import client, config

from tests.cluster.cluster import LAYOUT, ClusterUnavailable, api_ready, down, preflight, up
from tests.cluster.images import APP_IMAGE
from tests.cluster.layout import ROOT, Layout
from tests.cluster.processes import wait_until

CHART = ROOT / "charts" / "burstbuffer"
ORIGIN_SCRIPT = Path(__file__).resolve().parent / "origin.py"
CLI = Path(sys.executable).parent / "burstbuffer"
INJECTED = "burstbuffer"  # the injected container's name
ENABLED = {"burstbuffer.io/inject": "enabled"}  # a namespace's opt-in
WAIT = 180.0  # seconds for a pod, a Job, a rollout


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.cluster)


@dataclass(frozen=True)
class Cluster:
    """The running cluster: its layout and an API client as its administrator."""

    layout: Layout
    api: client.ApiClient

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    def env(self) -> dict[str, str]:
        """An environment for kubectl, helm and the CLI: this cluster, and kubectl's
        plugins (kubectl-burstbuffer) on the PATH."""
        path = f"{self.layout.user_bin}:{Path(sys.executable).parent}:{os.environ['PATH']}"
        return {**os.environ, "KUBECONFIG": str(self.layout.kubeconfig), "PATH": path}

    def run(self, *argv: str | Path, stdin: str | None = None, check: bool = True,
            timeout: float = WAIT) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """A command against the cluster (kubectl and helm found in `.cluster/bin`)."""
        done = subprocess.run(
            [str(a) for a in argv], input=stdin, env=self.env(), capture_output=True,
            text=True, timeout=timeout,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, argv))}: {done.stderr or done.stdout}")
        return done

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return self.run("kubectl", *args, stdin=stdin, check=check).stdout

    def apply(self, namespace: str, *documents: dict[str, Any]) -> None:
        self.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(documents))

    def pods(self, namespace: str, selector: str = "") -> list[client.V1Pod]:
        items: list[client.V1Pod] = self.core.list_namespaced_pod(
            namespace, label_selector=selector
        ).items
        return items

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float = WAIT) -> None:
        assert wait_until(ready, timeout, 0.5), f"{what}: not within {timeout:.0f} s"

    def stats(self, namespace: str, pod: str, port: int = 3129) -> dict[str, Any]:
        """The sidecar's /stats, through the API server's pod proxy."""
        raw = self.kubectl(
            "get", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/stats"
        )
        stats: dict[str, Any] = json.loads(raw)
        return stats


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    layout = LAYOUT
    started = not api_ready(layout)
    if started:
        try:
            preflight()
            up(layout, say=lambda line: print(line, file=sys.stderr))
        except ClusterUnavailable as e:
            pytest.skip(f"no Kubernetes cluster on this machine: {e}")
        except BaseException:
            # What started before the failure would outlive the session and hold the
            # cluster's ports and network against the next one.
            down(layout)
            raise
    api = config.new_client_from_config(config_file=str(layout.kubeconfig))
    yield Cluster(layout, api)
    api.close()
    if started and not os.environ.get("BURSTBUFFER_KEEP_CLUSTER"):
        down(layout)


@pytest.fixture
def make_namespace(cluster: Cluster) -> Iterator[Callable[..., str]]:
    """Namespaces of this test (`labels` on them), deleted at its end."""
    made: list[str] = []

    def make(prefix: str = "bb", labels: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{secrets.token_hex(3)}"
        body = client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels or {}))
        cluster.core.create_namespace(body)
        made.append(name)
        # Pods can be made once the namespace's default ServiceAccount exists.
        cluster.wait_for(
            f"the default ServiceAccount of {name}",
            lambda: bool(cluster.core.list_namespaced_service_account(name).items),
        )
        return name

    yield make
    for name in made:
        cluster.core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def training_namespace(
    cluster: Cluster, make_namespace: Callable[..., str], origin_ca: trustme.CA
) -> Callable[[str], str]:
    """Namespaces of this test, opted in, each holding the test origins' CA where the
    chart's `sidecar.upstreamCA` names it (as pods' namespaces must)."""

    def make(prefix: str) -> str:
        namespace = make_namespace(prefix, ENABLED)
        trust_origin(cluster, namespace, origin_ca)
        return namespace

    return make


@dataclass(frozen=True)
class Release:
    """The chart installed: its release name and namespace."""

    name: str
    namespace: str


def helm_install(
    cluster: Cluster, release: Release, *values: str, action: str = "install"
) -> subprocess.CompletedProcess[str]:
    """`helm install|upgrade --wait` of the chart in this checkout, with `--set` values;
    returns once the API server reaches the webhook (`wait_for_injection`)."""
    sets = [item for value in values for item in ("--set", value)]
    done = cluster.run(
        "helm", action, release.name, CHART, "--namespace", release.namespace,
        "--create-namespace", "--wait", "--timeout", "5m", *sets, timeout=360,
    )  # fmt: skip
    wait_for_injection(cluster)
    return done


def wait_for_injection(cluster: Cluster) -> None:
    """Wait until a pod that opts in is injected (a server-side dry run, nothing made).

    `helm --wait` returns once the injector's pods are ready, which can be before the API
    server reaches them through their Service; meanwhile the webhook's `failurePolicy:
    Ignore` lets pods start without the sidecar, and a Job's download fails on the
    origin's certificate."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "injection-probe-",
            "labels": {"burstbuffer.io/inject": "true"},
        },
        "spec": {"containers": [{"name": "probe", "image": APP_IMAGE, "command": ["true"]}]},
    }

    def injected_now() -> bool:
        made = cluster.core.create_namespaced_pod("default", probe, dry_run="All")
        return injected(made)

    cluster.wait_for("the webhook to inject a pod that opts in", injected_now)


@pytest.fixture(scope="module")
def release_values() -> tuple[str, ...]:
    """`--set` values of the module's release (a module overrides it)."""
    return ()


@pytest.fixture(scope="module")
def release(
    cluster: Cluster, release_values: tuple[str, ...], origin_ca: trustme.CA
) -> Iterator[Release]:
    """The chart installed for the tests of one module, uninstalled at its end. Its
    namespace holds the test origins' CA (for the parent tier's Squid, as in the pods'
    namespaces: `trust_origin`)."""
    installed = Release("burstbuffer", "burstbuffer-system")
    cluster.core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=installed.namespace))
    )
    trust_origin(cluster, installed.namespace, origin_ca)
    helm_install(cluster, installed, *release_values)
    yield installed
    cluster.run("helm", "uninstall", installed.name, "-n", installed.namespace, "--wait")
    cluster.core.delete_namespace(installed.namespace)
    cluster.wait_for(
        f"namespace {installed.namespace} to go",
        lambda: installed.namespace not in cluster.kubectl("get", "namespaces", "-o", "name"),
    )


@dataclass(frozen=True)
class Origin:
    """An HTTPS origin in the cluster: the host name pods use, and its files."""

    host: str
    namespace: str
    files: dict[str, int]  # path -> size

    def url(self, path: str) -> str:
        return f"https://{self.host}{path}"


ORIGIN_FILES = {"/train-0.bin": 3 * 1024 * 1024 + 17, "/labels.bin": 60_008}


@pytest.fixture(scope="module")
def origin(cluster: Cluster, origin_ca: trustme.CA) -> Iterator[Origin]:
    """An HTTPS origin in a namespace of its own, with a certificate of the test CA for
    the name `origin.<namespace>` (which pods resolve through their DNS search path)."""
    namespace = f"datasets-{secrets.token_hex(3)}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    host = f"origin.{namespace}"
    leaf = origin_ca.issue_cert(host)
    serve_tls(cluster, namespace, "origin", leaf, ORIGIN_SCRIPT,
              {"ORIGIN_FILES": json.dumps(ORIGIN_FILES)})  # fmt: skip
    yield Origin(host, namespace, ORIGIN_FILES)
    cluster.core.delete_namespace(namespace, propagation_policy="Background")


def serve_tls(
    cluster: Cluster,
    namespace: str,
    name: str,
    leaf: trustme.LeafCert,
    script: Path,
    env: dict[str, str],
) -> None:
    """A server of the tests in the cluster: `python3 SCRIPT DIR 8443` on the app image,
    DIR holding the script and `leaf`'s tls.crt and tls.key, with `env`, behind the
    Service `name` on port 443; returns once it is ready."""
    labels = {"app": name}
    container = {
        "name": name,
        "image": APP_IMAGE,
        "command": ["python3", f"/server/{script.name}", "/server", "8443"],
        "env": [{"name": key, "value": value} for key, value in env.items()],
        "volumeMounts": [{"name": "server", "mountPath": "/server"}],
        "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
    }
    pod = {
        "metadata": {"labels": labels},
        "spec": {
            "containers": [container],
            "volumes": [{"name": "server", "secret": {"secretName": name}}],
        },
    }
    documents: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "data": {
                "tls.crt": _b64(b"".join(p.bytes() for p in leaf.cert_chain_pems)),
                "tls.key": _b64(leaf.private_key_pem.bytes()),
                script.name: _b64(script.read_bytes()),
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"selector": labels, "ports": [{"port": 443, "targetPort": 8443}]},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels}, "template": pod},
        },
    ]
    cluster.apply(namespace, *documents)
    cluster.kubectl(
        "rollout", "status", "-n", namespace, f"deployment/{name}", f"--timeout={WAIT:.0f}s"
    )


def origin_requests(cluster: Cluster, origin: Origin, path: str) -> int:
    """How many GETs of `path` the origin answered (its access log)."""
    log = cluster.kubectl("logs", "-n", origin.namespace, "deployment/origin")
    return sum(1 for line in log.splitlines() if f'"GET {path} ' in line)


def trust_origin(cluster: Cluster, namespace: str, origin_ca: trustme.CA) -> str:
    """The test CA as the ConfigMap the chart's sidecar.upstreamCA names; its name."""
    body = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="dataset-ca"),
        data={"ca.crt": origin_ca.cert_pem.bytes().decode()},
    )
    cluster.core.create_namespaced_config_map(namespace, body)
    return "dataset-ca"


def injected(pod: client.V1Pod) -> bool:
    """The pod has the sidecar (native or classic) and the injector's status annotation."""
    names = [c.name for c in (pod.spec.init_containers or []) + pod.spec.containers]
    annotations = pod.metadata.annotations or {}
    return INJECTED in names and "burstbuffer.io/status" in annotations


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
