"""`burstbuffer status`: figures read from real sidecars through the pod proxy, pods that
cannot be read listed with the reason, every output format, one namespace or all."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from bench.harness import OriginServer, Sidecar, clean_env, free_port
from tests.ops.conftest import CLI, NAMESPACE, Cluster, injected_pod, namespace, plain_pod
from tests.sidecar.conftest import FILES, curl

SMALL = FILES["small.bin"]


def _by_pod(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{p['namespace']}/{p['pod']}": p for p in document["pods"]}


def _by_namespace(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["namespace"]: t for t in document["namespaces"]}


def test_status_reads_each_sidecar_through_the_pod_proxy(
    cluster: Cluster, start_sidecar: Callable[..., Sidecar], origin: OriginServer
) -> None:
    sidecar = start_sidecar()
    url = origin.url("small.bin")
    for _ in range(2):  # a miss, then a hit
        download = curl(sidecar, url)
        assert download.returncode == 0, download.stderr
        assert len(download.body) == SMALL
    sidecar.wait_for_entries(1)
    api = cluster.api
    api.put(injected_pod("reachable", NAMESPACE, sidecar.admin_port))
    api.put(injected_pod("refused", NAMESPACE, free_port()))
    api.put(injected_pod("pending", NAMESPACE, sidecar.admin_port, phase="Pending"))
    api.put({**plain_pod("plain", NAMESPACE), "status": {"phase": "Running"}})
    api.put(namespace("other"))
    api.put(injected_pod("elsewhere", "other", sidecar.admin_port))

    result = cluster.burstbuffer("status", "-o", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    pods = _by_pod(document)
    assert list(pods) == ["ml/pending", "ml/reachable", "ml/refused"]
    reachable = pods["ml/reachable"]
    assert reachable | {"hit_ratio": None} == {
        "namespace": "ml",
        "pod": "reachable",
        "capture": "proxy-env",
        "buffer_medium": "Memory",
        "buffer_size": "1Gi",
        "reachable": True,
        "state": "ok",
        "hits": 1,
        "misses": 1,
        "coalesced": 0,
        "passes": 0,
        "bytes_from_buffer": SMALL,
        "bytes_from_upstream": SMALL,
        "entries": 1,
        "buffer_bytes": SMALL,
        "hit_ratio": None,
    }
    assert reachable["hit_ratio"] == 0.5
    refused = pods["ml/refused"]
    assert refused["reachable"] is False and "hits" not in refused
    assert refused["state"].startswith("sidecar unreachable: 503 error trying to reach service")
    assert "connection refused" in refused["state"]
    assert pods["ml/pending"]["state"] == "pod is Pending"
    assert _by_namespace(document)["ml"] | {"hit_ratio": None} == {
        "namespace": "ml",
        "pods": 3,
        "unreachable": 2,
        "hits": 1,
        "misses": 1,
        "coalesced": 0,
        "passes": 0,
        "bytes_from_buffer": SMALL,
        "bytes_from_upstream": SMALL,
        "entries": 1,
        "buffer_bytes": SMALL,
        "hit_ratio": None,
    }

    # Every namespace, as YAML: the same sidecar counted for its second pod too.
    result = cluster.burstbuffer("status", "-A", "-o", "yaml")
    assert result.returncode == 0, result.stderr
    document = yaml.safe_load(result.stdout)
    assert list(_by_pod(document)) == [
        "ml/pending",
        "ml/reachable",
        "ml/refused",
        "other/elsewhere",
    ]
    totals = _by_namespace(document)
    assert sorted(totals) == ["ml", "other"]
    assert (totals["other"]["pods"], totals["other"]["hits"], totals["other"]["hit_ratio"]) == (
        1,
        1,
        0.5,
    )

    # The table: a line per pod, then a line per namespace.
    result = cluster.burstbuffer("status", "-n", "other")
    assert result.returncode == 0, result.stderr
    pod_lines, total_lines = result.stdout.strip().split("\n\n")
    header, line = pod_lines.splitlines()
    assert header.split()[:4] == ["NAMESPACE", "POD", "CAPTURE", "BUFFER"]
    assert line.split() == [
        "other", "elsewhere", "proxy-env", "1Gi", "Memory", "100.0KiB", "1", "1", "1", "0",
        "50.0%", "100.0KiB", "100.0KiB", "ok",
    ]  # fmt: skip
    header, line = total_lines.splitlines()
    assert header.split()[:3] == ["NAMESPACE", "PODS", "UNREACHABLE"]
    assert line.split()[:9] == ["other", "1", "0", "100.0KiB", "1", "1", "1", "0", "50.0%"]


def _status_of(pod: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {**pod, "status": {**pod["status"], **status}}


def test_pods_whose_sidecar_cannot_be_read_are_listed_with_the_reason(cluster: Cluster) -> None:
    api = cluster.api
    running = injected_pod("refused", NAMESPACE, free_port())
    api.put(running)
    crashing = {"name": "burstbuffer", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    api.put(_status_of({**running, "metadata": {**running["metadata"], "name": "crashing"}},
                       initContainerStatuses=[crashing]))  # fmt: skip
    no_ip = {k: v for k, v in running["status"].items() if k != "podIP"}
    api.put({**running, "metadata": {**running["metadata"], "name": "no-ip"}, "status": no_ip})
    api.put(_status_of({**running, "metadata": {**running["metadata"], "name": "loopback"}},
                       podIP="127.0.0.1"))  # fmt: skip
    api.put(injected_pod("done", NAMESPACE, free_port(), phase="Succeeded"))

    result = cluster.burstbuffer("status", "-o", "json")
    assert result.returncode == 0, result.stderr
    states = {
        name.split("/")[1]: p["state"] for name, p in _by_pod(json.loads(result.stdout)).items()
    }
    assert states == {
        "crashing": "sidecar waiting: CrashLoopBackOff",
        "done": "pod is Succeeded",
        "loopback": "sidecar unreachable: 400 address not allowed",
        "no-ip": "pod has no IP yet",
        "refused": states["refused"],
    }
    assert "connection refused" in states["refused"]

    # Without the right to use the pod proxy, every pod is listed with that reason.
    api.forbidden.add("get pods/proxy")
    result = cluster.burstbuffer("status")
    assert result.returncode == 0, result.stderr
    refused_line = next(line for line in result.stdout.splitlines() if " refused " in line)
    assert refused_line.split()[5:13] == ["-"] * 8
    assert 'sidecar unreachable: 403 pods "refused:' in refused_line
    assert 'cannot get resource "pods/proxy"' in refused_line


def test_no_injected_pods(cluster: Cluster) -> None:
    cluster.api.put({**plain_pod("plain", NAMESPACE), "status": {"phase": "Running"}})
    result = cluster.burstbuffer("status")
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr == f"No injected pods in namespace {NAMESPACE}.\n"
    result = cluster.burstbuffer("status", "-A", "-o", "json")
    assert json.loads(result.stdout) == {"pods": [], "namespaces": []}


@pytest.mark.parametrize("problem", ["forbidden", "no server", "no kubeconfig"])
def test_status_fails_with_one_line(cluster: Cluster, problem: str) -> None:
    if problem == "forbidden":
        cluster.api.forbidden.add("list pods")
        expected = 'burstbuffer: pods is forbidden: User "tester" cannot list resource "pods"'
    elif problem == "no server":
        port = free_port()
        cluster.kubeconfig.write_text(cluster.api.kubeconfig(NAMESPACE).replace(
            f":{cluster.api.server_port}", f":{port}"))  # fmt: skip
        expected = f"burstbuffer: the API server at http://127.0.0.1:{port} did not answer"
    else:
        cluster.kubeconfig.unlink()
        expected = f"burstbuffer: no usable cluster configuration ({cluster.kubeconfig})"
    result = cluster.burstbuffer("status")
    assert result.returncode == 1
    assert result.stderr.startswith(expected), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_without_kubeconfig_nor_cluster() -> None:
    result = subprocess.run(
        [str(CLI), "status"], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.startswith(
        "burstbuffer: no kubeconfig (~/.kube/config) and not in a cluster"
    )
    assert len(result.stderr.splitlines()) == 1


def test_context_chooses_the_cluster_and_its_namespace(cluster: Cluster) -> None:
    config = json.loads(cluster.api.kubeconfig(NAMESPACE))
    closed = f"http://127.0.0.1:{free_port()}"
    config["clusters"].append({"name": "gone", "cluster": {"server": closed}})
    config["contexts"].append(
        {"name": "gone", "context": {"cluster": "gone", "user": "fake", "namespace": "x"}}
    )
    config["current-context"] = "gone"
    cluster.kubeconfig.write_text(json.dumps(config))
    cluster.api.put(injected_pod("p", NAMESPACE, free_port(), phase="Pending"))
    result = cluster.burstbuffer("status", "-o", "json")
    assert result.returncode == 1
    assert result.stderr.startswith(f"burstbuffer: the API server at {closed} did not answer")
    result = cluster.burstbuffer("status", "--context", "fake", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert list(_by_pod(json.loads(result.stdout))) == [f"{NAMESPACE}/p"]
