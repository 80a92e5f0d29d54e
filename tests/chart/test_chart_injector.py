"""The chart and the injector agree: same defaults, and the ConfigMap makes the pods it says.

The injector reads the ConfigMap's `config.yaml`; these tests take that document from
the rendered chart, give it to the real `burstbuffer-injector render` (a subprocess, as
`kubectl`-side users run it), and check the pod it produces against the values that
went into the chart.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmchart import (
    CHART,
    KUBE_VERSIONS,
    SCENARIOS,
    injector_config,
    merged_values,
    pod_template,
    render,
    validate_builtin,
)

from injector import settings as injector_settings
from injector.mutate import index_charge
from injector.quantity import parse_bytes
from sidecar import settings as sidecar_settings

INJECTOR_COMMAND = Path(sys.executable).parent / "burstbuffer-injector"

APP_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train", "namespace": "ml", "labels": {"app": "train"}},
    "spec": {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "train",
                "image": "python:3.12-slim",
                "command": ["python", "-c", "print('training')"],
            }
        ],
    },
}


def _merged_sidecar_values(scenario: str) -> dict[str, Any]:
    """values.yaml's sidecar section with the scenario's overrides (as Helm merges them)."""
    sidecar: dict[str, Any] = merged_values(SCENARIOS[scenario])["sidecar"]
    return sidecar


def test_values_defaults_are_the_injector_defaults() -> None:
    expected = injector_settings.to_document(injector_settings.InjectorSettings())
    assert injector_config(render()) == expected


def test_values_intercept_list_is_the_sidecar_default() -> None:
    assert (
        tuple(_merged_sidecar_values("default")["intercept"]) == sidecar_settings.DEFAULT_INTERCEPT
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_injector_accepts_every_rendered_configuration(scenario: str) -> None:
    documents = render(SCENARIOS[scenario])
    config = injector_settings.from_document(injector_config(documents))
    # The sidecar runs the image the injector itself runs.
    (container,) = pod_template(documents)["spec"]["containers"]
    assert config.image == container["image"]
    assert config.image_pull_policy == container["imagePullPolicy"]


def _inject(documents: list[dict[str, Any]], tmp_path: Path) -> dict[str, Any]:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(injector_config(documents)))
    result = subprocess.run(
        [INJECTOR_COMMAND, "render", "--config", config_file, "--namespace", "ml"],
        input=yaml.safe_dump(APP_POD),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    pod: dict[str, Any] = yaml.safe_load(result.stdout)
    return pod


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


@pytest.mark.parametrize(
    "scenario",
    [
        "default",
        "classic-sidecar",
        "pmem-storage-class",
        "pmem-host-path",
        "everything-else",
        "parent-cache",
        "parent-cache-https-url",
    ],
)
def test_the_injector_with_the_chart_configuration_makes_the_expected_pod(
    scenario: str, tmp_path: Path
) -> None:
    documents = render(SCENARIOS[scenario])
    values = _merged_sidecar_values(scenario)
    pod = _inject(documents, tmp_path)
    spec = pod["spec"]

    # The sidecar: native (first init container, restartPolicy Always) or classic.
    if values["nativeSidecar"]:
        sidecar = spec["initContainers"][0]
        assert sidecar["restartPolicy"] == "Always"
    else:
        sidecar = spec["containers"][0]
        assert "restartPolicy" not in sidecar
    assert sidecar["name"] == "burstbuffer"
    (injector_container,) = pod_template(documents)["spec"]["containers"]
    assert sidecar["image"] == injector_container["image"]
    assert sidecar["imagePullPolicy"] == injector_container["imagePullPolicy"]
    assert sidecar["command"] == ["burstbuffer-sidecar"]
    assert sidecar["securityContext"]["runAsUser"] == values["runAsUser"]
    assert sidecar["securityContext"]["runAsNonRoot"] is True

    # Its flags, read back with the sidecar's own parser.
    flags = sidecar_settings.parse(sidecar["args"], {})
    assert flags.listen_host == "127.0.0.1"
    assert flags.listen_port == values["proxyPort"]
    assert flags.admin_port == values["adminPort"]
    assert flags.eviction == values["buffer"]["eviction"]
    assert flags.intercept == tuple(values["intercept"])
    assert flags.revalidate is values["revalidate"]
    assert flags.parent == tuple(injector_config(documents)["parents"])
    assert 0 < flags.buffer_size < parse_bytes(values["buffer"]["size"])
    # The PodMonitor finds sidecars by this port name.
    assert sidecar["ports"] == [
        {"name": "bb-admin", "containerPort": values["adminPort"], "protocol": "TCP"}
    ]

    # The buffer volume, on the configured medium.
    volumes = _by_name(spec["volumes"])
    (buffer_mount,) = [
        m for m in sidecar["volumeMounts"] if str(flags.buffer_dir).startswith(m["mountPath"])
    ]
    volume = volumes[buffer_mount["name"]]
    buffer = values["buffer"]
    if buffer["medium"] == "Memory":
        assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": buffer["size"]}
        limit = parse_bytes(sidecar["resources"]["limits"]["memory"])
        size = parse_bytes(buffer["size"])
        configured = parse_bytes(values["resources"]["limits"]["memory"])
        assert limit == configured + size + index_charge(size)
    elif buffer["medium"] == "Disk":
        assert volume["emptyDir"] == {"sizeLimit": buffer["size"]}
    elif buffer["pmem"]["storageClassName"]:
        claim = volume["ephemeral"]["volumeClaimTemplate"]["spec"]
        assert claim["storageClassName"] == buffer["pmem"]["storageClassName"]
    else:
        assert volume["hostPath"]["path"] == buffer["pmem"]["hostPath"]

    # The app container: proxied through the sidecar, trusting the pod's bundle.
    app = _by_name(spec["containers"])["train"]
    env = {e["name"]: e.get("value") for e in app["env"]}
    assert env["https_proxy"] == env["HTTPS_PROXY"] == f"http://127.0.0.1:{values['proxyPort']}"
    for entry in values["noProxy"]:
        assert entry in env["no_proxy"].split(",")
    mount_paths = {m["mountPath"] for m in app["volumeMounts"]}
    assert {values["trust"]["mountPath"], *values["trust"]["bundlePaths"]} <= mount_paths
    assert env["SSL_CERT_FILE"] == values["trust"]["mountPath"] + "/ca-bundle.crt"

    # An https parent's CA: the sidecar's --parent-ca, mounted into the sidecar alone.
    parent_ca = merged_values(SCENARIOS[scenario])["parentCache"]["ca"]
    if parent_ca["configMapName"]:
        (ca_mount,) = [
            m for m in sidecar["volumeMounts"] if str(flags.parent_ca).startswith(m["mountPath"])
        ]
        assert str(flags.parent_ca) == f"{ca_mount['mountPath']}/{parent_ca['key']}"
        assert volumes[ca_mount["name"]]["configMap"]["name"] == parent_ca["configMapName"]
        assert ca_mount["name"] not in {m["name"] for m in app["volumeMounts"]}
        assert str(flags.upstream_ca) != str(flags.parent_ca)
    else:
        assert flags.parent_ca is None

    assert "burstbuffer.io/status" in pod["metadata"]["annotations"]
    for version in KUBE_VERSIONS:
        validate_builtin(pod, version)


def test_chart_app_version_is_the_package_version() -> None:
    # image.tag defaults to appVersion: a release must bump both together.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == importlib.metadata.version("burstbuffer")
