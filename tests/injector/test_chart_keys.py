"""The injector's newer keys through the chart: values -> ConfigMap -> `render` -> the pod.

The chart copies `sidecar:` into the injector's configuration as it is; these tests check
that the capture keys, `upstreamCA` and `prometheusAnnotations` pass the values schema,
that the schema refuses what the injector refuses, and that the injector given the
rendered ConfigMap makes the pod those values describe. (tests/chart checks that
values.yaml's defaults are the injector's defaults.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from podcheck import check_pod

from injector import names, settings

CHART = Path(__file__).resolve().parents[2] / "charts" / "burstbuffer"
INJECTOR = Path(sys.executable).parent / "burstbuffer-injector"

VALUES = {
    "sidecar": {
        "capture": "transparent",
        "transparentPort": 15001,
        "prometheusAnnotations": True,
        "upstreamCA": {"configMapName": "corp-root-ca", "key": "root-ca.pem"},
        "httpFreshness": ["pypi.org", "*.hf.co"],
    }
}
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train", "namespace": "ml"},
    "spec": {"containers": [{"name": "train", "image": "python:3.12"}]},
}


def rendered(values: dict[str, Any]) -> dict[str, str]:
    with helm_python.Chart.load(CHART) as chart:
        files: dict[str, str] = chart.render(
            values, name="burstbuffer", namespace="burstbuffer-system", is_install=True
        )
    return files


def config_text(files: dict[str, str]) -> str:
    text = next(t for path, t in files.items() if path.endswith("templates/configmap.yaml"))
    config: str = yaml.safe_load(text)["data"]["config.yaml"]
    return config


def test_the_new_keys_reach_the_injector_and_the_pod(tmp_path: Path) -> None:
    config = config_text(rendered(VALUES))
    parsed = settings.load(config)
    assert (parsed.capture, parsed.transparent_port) == ("transparent", 15001)
    assert parsed.prometheus_annotations
    assert (parsed.upstream_ca.config_map_name, parsed.upstream_ca.key) == (
        "corp-root-ca",
        "root-ca.pem",
    )

    (tmp_path / "config.yaml").write_text(config)
    done = subprocess.run(
        [INJECTOR, "render", "--config", tmp_path / "config.yaml"],
        input=yaml.safe_dump(POD),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    pod = yaml.safe_load(done.stdout)
    check_pod(pod)
    redirect, sidecar = pod["spec"]["initContainers"][:2]
    assert redirect["name"] == names.REDIRECT_CONTAINER
    assert redirect["command"][-1] == "15001"
    args = sidecar["args"]
    assert args[args.index("--upstream-ca") + 1] == f"{names.UPSTREAM_CA_DIR}/root-ca.pem"
    assert args[args.index("--http-freshness") + 1] == "pypi.org,*.hf.co"
    volume = next(v for v in pod["spec"]["volumes"] if "configMap" in v)
    assert volume["configMap"]["name"] == "corp-root-ca"
    assert pod["metadata"]["annotations"][names.PROMETHEUS_PORT] == "3129"


@pytest.mark.parametrize(
    ("sidecar", "mentioned"),
    [
        ({"proxyPort": 443}, "proxyPort"),
        ({"transparentPort": 80}, "transparentPort"),
        ({"transparentPort": 0}, "transparentPort"),
        ({"prometheusAnnotations": "yes"}, "prometheusAnnotations"),
        ({"upstreamCA": {"configMapName": "Corp_CA"}}, "configMapName"),
        ({"upstreamCA": {"key": "a/b"}}, "key"),
        ({"upstreamCA": {"key": ".."}}, "key"),
        ({"upstreamCA": {"name": "corp-ca"}}, "additional properties 'name'"),
        ({"httpFreshness": ["https://pypi.org"]}, "httpFreshness"),
    ],
)
def test_the_schema_refuses_what_the_injector_refuses(
    sidecar: dict[str, Any], mentioned: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=mentioned):
        rendered({"sidecar": sidecar})
    document = yaml.safe_dump(sidecar)
    with pytest.raises(settings.ConfigError):
        settings.load(document)


def test_notes_warn_about_pod_security_only_for_transparent() -> None:
    def notes(values: dict[str, Any]) -> str:
        return next(t for path, t in rendered(values).items() if path.endswith("NOTES.txt"))

    assert "NET_ADMIN" in notes(VALUES)
    assert "NET_ADMIN" not in notes({})
