"""The `burstbuffer` CLI run as operators run it: a subprocess with a kubeconfig, against
the API server stand-in (tests/chart/fakekube.py) whose pod proxy reaches real sidecars
and whose dry runs go through the real injector."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.harness import clean_env
from injector import review
from injector.settings import InjectorSettings
from tests.chart.fakekube import FakeKube, running

# The real sidecar and its origin, as the sidecar's own end-to-end tests start them.
from tests.sidecar.conftest import (  # noqa: F401
    dataset,
    hosts_file,
    needs_root,
    origin,
    start_sidecar,
)

CLI = Path(sys.executable).parent / "burstbuffer"
NAMESPACE = "ml"
CLI_TIMEOUT = 60  # seconds for one command


@dataclass
class Cluster:
    api: FakeKube
    kubeconfig: Path

    def burstbuffer(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`burstbuffer ARGS --kubeconfig F` with a clean environment (no ~/.kube)."""
        return subprocess.run(
            [str(CLI), *args, "--kubeconfig", str(self.kubeconfig)],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
            check=False,
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """An empty API server but for the namespace `ml`, the kubeconfig's namespace."""
    with running() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig(namespace=NAMESPACE))
        api.put(namespace(NAMESPACE))
        yield Cluster(api, kubeconfig)


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": labels or {}},
    }


def injected_pod(
    name: str, namespace: str, admin_port: int, phase: str = "Running", **settings: Any
) -> dict[str, Any]:
    """A pod as the real injector makes it (its sidecar's admin port is `admin_port`),
    with the status the kubelet reports once the sidecar runs."""
    pod = plain_pod(name, namespace)
    settings_object = InjectorSettings(admin_port=admin_port, **settings)
    injected = review.inject(pod, settings_object, f"{namespace}/{name}").pod
    injected["status"] = {"phase": phase}
    if phase == "Running":
        injected["status"] |= {
            "podIP": "10.244.0.7",
            "initContainerStatuses": [
                {"name": "burstbuffer", "ready": True, "state": {"running": {}}}
            ],
            "containerStatuses": [{"name": "train", "ready": True, "state": {"running": {}}}],
        }
    return injected


def plain_pod(name: str, namespace: str) -> dict[str, Any]:
    return copy.deepcopy(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": "train"}},
            "spec": {"containers": [{"name": "train", "image": "python:3.12-slim"}]},
        }
    )
