"""`kubectl burstbuffer`: the operators' CLI as a kubectl plugin, run by a real kubectl.

kubectl finds a plugin as an executable named `kubectl-<name>` on the PATH and runs it
with the arguments after the plugin's name; the plugin answers exactly as `burstbuffer`
does, naming itself `kubectl burstbuffer`.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from bench.harness import clean_env
from tests.ops.conftest import CLI, CLI_TIMEOUT, NAMESPACE, Cluster, injected_pod

PLUGIN = CLI.with_name("kubectl-burstbuffer")


def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    """A real kubectl, with the project's executables first on the PATH."""
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.skip("no kubectl here (it runs the plugin; the plugin itself is tested too)")
    env = clean_env(PATH=f"{CLI.parent}:{clean_env()['PATH']}")
    return subprocess.run(
        [binary, *args], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT
    )


def test_the_plugin_names_itself_kubectl_burstbuffer() -> None:
    def plugin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(PLUGIN), *args], env=clean_env(), capture_output=True, text=True,
            timeout=CLI_TIMEOUT,
        )  # fmt: skip

    assert plugin("--help").stdout.startswith("usage: kubectl burstbuffer [-h] {status,check}")
    missing = plugin("status", "--kubeconfig", "/nonexistent/config")
    assert missing.returncode == 1
    assert missing.stderr.startswith("kubectl burstbuffer: no usable cluster configuration")


def test_kubectl_finds_and_runs_the_plugin() -> None:
    listed = kubectl("plugin", "list", "--name-only")
    assert "kubectl-burstbuffer" in listed.stdout.split(), listed.stdout + listed.stderr
    helped = kubectl("burstbuffer", "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: kubectl burstbuffer [-h] {status,check}")


def test_kubectl_burstbuffer_status_is_burstbuffer_status(cluster: Cluster) -> None:
    cluster.api.put(injected_pod("pending", NAMESPACE, 3129, phase="Pending"))
    args = ("status", "-o", "json", "--kubeconfig", str(cluster.kubeconfig))
    through_kubectl = kubectl("burstbuffer", *args)
    assert through_kubectl.returncode == 0, through_kubectl.stderr
    pods = json.loads(through_kubectl.stdout)["pods"]
    assert [(p["pod"], p["state"]) for p in pods] == [("pending", "pod is Pending")]
    assert through_kubectl.stdout == cluster.burstbuffer(*args[:3]).stdout
