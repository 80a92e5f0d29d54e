"""The real-cluster end-to-end script (e2e-kind.sh), and the checks of it that run anywhere.

On the cluster it also runs the operators' CLI of this checkout (`burstbuffer check` and
`burstbuffer status`) against the real API server and pod proxy.

The script needs kubectl, helm and either docker + kind (a throwaway kind cluster) or,
with E2E_USE_CURRENT_CONTEXT=1, a reachable cluster; without them the end-to-end test
is skipped with the reason. What can be checked without a cluster is checked always:
the shell and Python the Job runs parse, and the Job the script submits is valid
Kubernetes before and after the injector has added its sidecar.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "e2e-kind.sh"
VALUES = HERE.parents[1] / "charts" / "burstbuffer" / "values.yaml"
INJECTOR_COMMAND = Path(sys.executable).parent / "burstbuffer-injector"
CLI = Path(sys.executable).parent / "burstbuffer"
KUBE_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


def _job() -> dict[str, Any]:
    result = subprocess.run(
        ["bash", SCRIPT, "--print-job"], capture_output=True, text=True, timeout=30, check=True
    )
    job: dict[str, Any] = yaml.safe_load(result.stdout)
    return job


def test_scripts_parse(tmp_path: Path) -> None:
    for script in (SCRIPT, HERE / "job" / "download-twice.sh"):
        subprocess.run(["bash", "-n", script], check=True, timeout=30)
    py_compile.compile(
        str(HERE / "job" / "fetch_again.py"), cfile=str(tmp_path / "x.pyc"), doraise=True
    )


def test_job_is_valid_before_and_after_injection() -> None:
    job = _job()
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    template = job["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", **template}
    pod["metadata"] = {**template["metadata"], "name": "download-twice-x"}
    result = subprocess.run(
        [INJECTOR_COMMAND, "render", "--namespace", job["metadata"]["namespace"]],
        input=yaml.safe_dump(pod),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    injected = yaml.safe_load(result.stdout)
    assert injected["spec"]["initContainers"][0]["name"] == "burstbuffer"
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(injected, version, strict=True)


def test_job_reads_stats_on_the_charts_admin_port() -> None:
    admin_port = yaml.safe_load(VALUES.read_text())["sidecar"]["adminPort"]
    (container,) = _job()["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["E2E_ADMIN_PORT"]["value"] == str(admin_port)
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def _quiet(*command: str) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _why_not_runnable() -> str | None:
    """None if the end-to-end script can run here, else the reason it cannot."""
    if os.environ.get("BURSTBUFFER_CLUSTER_E2E") != "1":
        # Opt-in: it builds an image and creates a cluster, minutes of work.
        return "opt-in: set BURSTBUFFER_CLUSTER_E2E=1 (needs a cluster; see docs/chart.md)"
    use_current = os.environ.get("E2E_USE_CURRENT_CONTEXT") == "1"
    tools = ["kubectl", "helm"] if use_current else ["docker", "kind", "kubectl", "helm"]
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH (see docs/chart.md, real-cluster test)"
    if use_current:
        if not _quiet("kubectl", "cluster-info"):
            return "E2E_USE_CURRENT_CONTEXT=1 but no cluster answers in the current context"
    elif not _quiet("docker", "info"):
        return "docker is installed but no Docker engine is reachable (kind needs one)"
    return None


@pytest.mark.cluster
@pytest.mark.timeout(3600)
def test_end_to_end_on_a_real_cluster() -> None:
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "BURSTBUFFER_CLI": str(CLI)}
    result = subprocess.run(["bash", SCRIPT], env=env, timeout=3500, check=False)
    assert result.returncode == 0, "e2e-kind.sh failed; its output above says where"
