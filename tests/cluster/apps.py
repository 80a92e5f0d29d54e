"""The app side of the cluster tests: pods of the app image that download as a training job
does, and what their logs say (the files' hashes, the sidecar's /stats)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from kubernetes import client

from tests.cluster.conftest import WAIT, Cluster, Origin
from tests.cluster.images import APP_IMAGE
from tests.cluster.origin import content
from tests.cluster.processes import wait_until

# The app reads the sidecar's /stats on the pod's own address once its downloads are
# done (past the proxy: it is a look at the sidecar, not a download), and prints it.
PRINT_STATS = (
    'python3 -c "import os, urllib.request; '
    "opener = urllib.request.build_opener(urllib.request.ProxyHandler({})); "
    "print('STATS', opener.open('http://%s:3129/stats' % os.environ['POD_IP']).read().decode())\""
)
_HASH_LINE = re.compile(r"^([0-9a-f]{64})  /tmp/", re.M)


def download_script(*urls: str) -> str:
    """Fetch each URL with the image's own wget, curl and Python, as a training job would,
    with no proxy or CA option (what the injector set is all they use); print the files'
    hashes and the sidecar's /stats."""
    lines = ["set -eu"]
    for index, url in enumerate(urls):
        fetch = f"open('/tmp/{index}.py', 'wb').write(urllib.request.urlopen('{url}').read())"
        lines += [
            f"wget -q -O /tmp/{index}.wget {url}",
            f"curl -sSf -o /tmp/{index}.curl {url}",
            f'python3 -c "import urllib.request; {fetch}"',
        ]
    lines += ["sha256sum /tmp/*.wget /tmp/*.curl /tmp/*.py", PRINT_STATS]
    return "\n".join(lines)


def app_pod(origin: Origin, script: str, **spec: Any) -> dict[str, Any]:
    """A pod template of the app image running `script`, its origin's host intercepted."""
    return {
        "metadata": {
            "labels": {"app": "download"},
            "annotations": {"burstbuffer.io/intercept": origin.host},
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": APP_IMAGE,
                    "command": ["sh", "-c", script],
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                }
            ],
            "terminationGracePeriodSeconds": 5,
            **spec,
        },
    }


def download_job(origin: Origin, path: str) -> dict[str, Any]:
    """A Job that downloads `path` three times (wget, curl, urllib), once through."""
    template = app_pod(origin, download_script(origin.url(path)), restartPolicy="Never")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "download"},
        "spec": {"backoffLimit": 0, "template": template},
    }


def printed_stats(log: str) -> dict[str, Any]:
    """The last /stats the app printed."""
    assert "STATS " in log, log
    stats: dict[str, Any] = json.JSONDecoder().raw_decode(log.rsplit("STATS ", 1)[1])[0]
    return stats


def printed_hashes(log: str) -> set[str]:
    """The SHA-256 of every file the app downloaded (sha256sum's lines)."""
    return set(_HASH_LINE.findall(log))


def origin_hash(origin: Origin, path: str) -> str:
    return hashlib.sha256(content(path, origin.files[path])).hexdigest()


def app_log(cluster: Cluster, namespace: str, pod: str) -> str:
    return cluster.kubectl("logs", "-n", namespace, pod, "-c", "app")


def completed_download(
    cluster: Cluster, namespace: str, origin: Origin, path: str, job: dict[str, Any] | None = None
) -> tuple[client.V1Pod, dict[str, Any]]:
    """`job` (default: `download_job`) run to completion: its pod, and the sidecar's /stats
    it printed once every file was checked byte for byte against the origin's."""
    cluster.apply(namespace, job or download_job(origin, path))
    job_completed(cluster, namespace, "download")
    (pod,) = cluster.pods(namespace, "app=download")
    log = app_log(cluster, namespace, pod.metadata.name)
    # wget, curl and Python's urllib, each byte-identical to the origin's file.
    assert printed_hashes(log) == {origin_hash(origin, path)}, log
    return pod, printed_stats(log)


def job_completed(cluster: Cluster, namespace: str, name: str, timeout: float = WAIT) -> None:
    """Wait for the Job to complete; fail as soon as it fails, or after `timeout` seconds,
    with what its pods and the namespace's events say."""
    ended = "still running"

    def done() -> bool:
        nonlocal ended
        status = cluster.batch.read_namespaced_job_status(name, namespace).status
        for condition in status.conditions or []:
            if condition.type in ("Complete", "Failed") and condition.status == "True":
                ended = condition.type
                return True
        return False

    wait_until(done, timeout, 0.5)
    assert ended == "Complete", job_report(cluster, namespace, name, ended)


def job_report(cluster: Cluster, namespace: str, name: str, ended: str) -> str:
    """What a Job that did not complete left to read: its pods' states, each container's
    log (the app's and the sidecar's, the previous run's too) and the namespace's events."""
    lines = [f"job/{name} in {namespace}: {ended}"]
    for pod in cluster.pods(namespace, f"job-name={name}"):
        statuses = (pod.status.init_container_statuses or []) + (
            pod.status.container_statuses or []
        )
        lines.append(f"pod {pod.metadata.name}: {pod.status.phase}")
        for status in statuses:
            lines.append(f"  {status.name}: restarts {status.restart_count}, {status.state}")
            for previous in ("false", "true"):
                log = cluster.kubectl(
                    "logs", "-n", namespace, pod.metadata.name, "-c", status.name,
                    f"--previous={previous}", "--tail=60", check=False,
                )  # fmt: skip
                if log:
                    lines.append(f"  --- {status.name} log (previous={previous}):\n{log}")
    events = cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp",
                             check=False)  # fmt: skip
    lines.append(f"events:\n{events}")
    return "\n".join(lines)
