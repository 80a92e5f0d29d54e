"""Who gets the sidecar, decided by the real admission chain: the API server evaluates the
webhook's namespaceSelector and objectSelector and calls the injector through its
Service; the controllers make the pods of every workload kind (generateName, no name
yet, the namespace only in the request)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.conftest import ENABLED, Cluster, Release, injected
from tests.cluster.images import APP_IMAGE

SLEEP = {"name": "app", "image": APP_IMAGE, "command": ["sleep", "3600"]}


def _template(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "work", **(labels or {})}},
        "spec": {"containers": [SLEEP], "terminationGracePeriodSeconds": 1, **spec},
    }


SELECTOR = {"matchLabels": {"app": "work"}}


def _workload(api_version: str, kind: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "work"}, "spec": spec}


WORKLOADS: dict[str, dict[str, Any]] = {
    "Pod": {"apiVersion": "v1", "kind": "Pod", **_template(), "metadata": {
        "name": "work", "labels": {"app": "work"}}},
    "Deployment": _workload("apps/v1", "Deployment", selector=SELECTOR, template=_template()),
    "Job": _workload("batch/v1", "Job", template=_template(restartPolicy="Never")),
    "StatefulSet": _workload("apps/v1", "StatefulSet", selector=SELECTOR, serviceName="work",
                             template=_template()),
    "DaemonSet": _workload("apps/v1", "DaemonSet", selector=SELECTOR, template=_template()),
    "CronJob": _workload("batch/v1", "CronJob", schedule="0 0 1 1 *",
                         jobTemplate={"spec": {"template": _template(restartPolicy="Never")}}),
}  # fmt: skip


def _first_pod(cluster: Cluster, namespace: str) -> client.V1Pod:
    pods: list[client.V1Pod] = []

    def made() -> bool:
        pods[:] = cluster.pods(namespace, "app=work")
        return bool(pods)

    cluster.wait_for(f"a pod of the workload in {namespace}", made)
    return pods[0]


@pytest.mark.parametrize("kind", WORKLOADS)
def test_every_workload_kind_of_an_enabled_namespace_is_injected(
    cluster: Cluster, release: Release, make_namespace: Callable[..., str], kind: str
) -> None:
    namespace = make_namespace("inject", ENABLED)
    cluster.apply(namespace, WORKLOADS[kind])
    if kind == "CronJob":
        # The Job the CronJob controller would make at its schedule, made now.
        cluster.kubectl("create", "job", "-n", namespace, "work-now", "--from=cronjob/work")
    pod = _first_pod(cluster, namespace)
    assert injected(pod), f"{kind}'s pod {pod.metadata.name} was not injected"
    # The native sidecar: the first init container, restarted always.
    first = pod.spec.init_containers[0]
    assert (first.name, first.restart_policy) == ("burstbuffer", "Always")


def test_an_unlabelled_namespace_is_left_alone(
    cluster: Cluster, release: Release, make_namespace: Callable[..., str]
) -> None:
    namespace = make_namespace("plain")
    cluster.apply(namespace, WORKLOADS["Deployment"])
    assert not injected(_first_pod(cluster, namespace))


def test_a_pod_opts_out_by_label_and_by_annotation(
    cluster: Cluster, release: Release, make_namespace: Callable[..., str]
) -> None:
    namespace = make_namespace("optout", ENABLED)
    by_label = _pod("by-label", labels={"burstbuffer.io/inject": "false"})
    by_annotation = _pod("by-annotation", annotations={"burstbuffer.io/inject": "false"})
    cluster.apply(namespace, by_label, by_annotation)
    for name in ("by-label", "by-annotation"):
        assert not injected(cluster.core.read_namespaced_pod(name, namespace)), name


def test_an_opted_in_pod_of_another_namespace_is_injected(
    cluster: Cluster, release: Release, make_namespace: Callable[..., str]
) -> None:
    namespace = make_namespace("optin")
    cluster.apply(namespace, _pod("alone", labels={"burstbuffer.io/inject": "true"}), _pod("other"))
    assert injected(cluster.core.read_namespaced_pod("alone", namespace))
    assert not injected(cluster.core.read_namespaced_pod("other", namespace))


def test_kube_system_is_never_injected(cluster: Cluster, release: Release) -> None:
    pod = _pod("burstbuffer-never", labels={"burstbuffer.io/inject": "true"})
    cluster.apply("kube-system", pod)
    try:
        assert not injected(cluster.core.read_namespaced_pod("burstbuffer-never", "kube-system"))
    finally:
        cluster.kubectl("delete", "pod", "-n", "kube-system", "burstbuffer-never", "--wait=false")


def _pod(
    name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    template = _template(labels)
    metadata = {"name": name, **template["metadata"], "annotations": annotations or {}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}
