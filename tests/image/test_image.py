"""The image, built from the project's Dockerfile and run as an injected pod's containers.

The Dockerfile is built on a local Debian base (no registry is reached; see
`dockerd.base_image`). A plain pod whose app container runs `wget` and then `curl` is
injected by `burstbuffer-injector render` (the real entry point) and run by
`dockerpod.DockerPod`, which starts each container exactly as the rendered spec says:
the sidecar from the built image as UID 65532 with a read-only root, every capability
dropped, the tmpfs buffer and the shared trust volume; the app container in the same
network namespace with the patch's env and mounts. The origin is `bench.origin` on the
node's address on the pod network, named `datasets.test` for the pod, with a certificate
from a private test CA that reaches the sidecar as the chart passes it: a ConfigMap
named by `upstreamCA`, given to `--upstream-ca`.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from bench.harness import free_port, http_get
from injector import names
from tests.image.conftest import Images
from tests.image.dockerd import Docker
from tests.image.dockerpod import DockerPod, internal_network

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
APP_IMAGE = "debian:trixie"
HOST = "datasets.test"
DATA_SIZE = 3 * 2**20 + 4321  # not a multiple of any buffer size
ORIGIN_CA_CONFIG_MAP = "test-origin-ca"
CONFIG = f"upstreamCA: {{configMapName: {ORIGIN_CA_CONFIG_MAP}, key: ca.crt}}\n"


def start_origin(
    node_ip: str, ca: trustme.CA, data: bytes, tmp: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """bench.origin on the node's address on the pod network: (process, its base URL)."""
    (tmp / "files").mkdir()
    (tmp / "files" / "data.bin").write_bytes(data)
    cert = ca.issue_cert(HOST, node_ip)
    cert.private_key_pem.write_to_path(str(tmp / "origin.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp / "origin.pem"))
    ca.cert_pem.write_to_path(str(tmp / "origin-ca.pem"))
    port = free_port()
    argv = [sys.executable, "-m", "bench.origin", "--dir", str(tmp / "files")]
    argv += ["--host", node_ip, "--port", str(port)]
    argv += ["--cert", str(tmp / "origin.pem"), "--key", str(tmp / "origin.key")]
    with open(tmp / "origin.log", "wb") as log:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, (tmp / "origin.log").read_text()
        try:
            http_get(f"https://{node_ip}:{port}/__requests", cafile=tmp / "origin-ca.pem")
            return process, f"https://{node_ip}:{port}"
        except OSError:
            time.sleep(0.1)
    process.terminate()
    raise AssertionError("the test origin did not start")


def origin_requests(base: str, cafile: Path) -> dict[str, int]:
    status, body = http_get(f"{base}/__requests", cafile=cafile)
    assert status == 200
    return json.loads(body)["requests"]  # type: ignore[no-any-return]


def render(pod: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """`burstbuffer-injector render`, the command a user runs."""
    (tmp / "config.yaml").write_text(CONFIG)
    argv = [str(VENV_BIN / "burstbuffer-injector"), "render", "--config", str(tmp / "config.yaml")]
    done = subprocess.run(
        argv, input=yaml.safe_dump(pod).encode(), capture_output=True, timeout=60, check=True
    )
    rendered = yaml.safe_load(done.stdout)
    assert isinstance(rendered, dict)
    return rendered


def sidecar_of(pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod["spec"]
    return next(
        c for c in (spec.get("initContainers") or []) + spec["containers"]
        if c["name"] == names.CONTAINER
    )  # fmt: skip


@pytest.fixture
def network(docker: Docker) -> Iterator[tuple[str, str]]:
    with internal_network(docker) as made:
        yield made


def test_injected_pod_downloads_through_the_image(
    docker: Docker,
    images: Images,
    network: tuple[str, str],
    origin_ca: trustme.CA,
    tmp_path: Path,
) -> None:
    network_name, node_ip = network
    data = random.Random(12).randbytes(DATA_SIZE)
    origin, base = start_origin(node_ip, origin_ca, data, tmp_path)
    url = f"https://{HOST}:{base.rsplit(':', 1)[1]}/files/data.bin"
    script = f"wget -q -O /out/wget.bin {url} && curl -sS --fail -o /out/curl.bin {url}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "annotations": {names.INTERCEPT: HOST}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "containers": [
                {
                    "name": "app",
                    "image": APP_IMAGE,
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                }
            ],
            "volumes": [{"name": "out", "emptyDir": {}}],
        },
    }
    rendered = render(pod, tmp_path)
    sidecar = sidecar_of(rendered)
    admin_port = next(
        p["containerPort"] for p in sidecar["ports"] if p["name"] == names.ADMIN_PORT_NAME
    )
    run = DockerPod(
        docker,
        rendered,
        images={sidecar["image"]: images.burstbuffer, APP_IMAGE: images.app},
        sandbox_image=images.base,
        workdir=tmp_path / "pod",
        config_maps={ORIGIN_CA_CONFIG_MAP: {"ca.crt": origin_ca.cert_pem.bytes().decode()}},
        hosts={HOST: node_ip},
        network=network_name,
    )
    try:
        with run:
            run.start()
            code = run.wait("app", timeout=120)
            assert code == 0, run.logs("app") + run.logs(names.CONTAINER)

            assert run.volume_file("out", "wget.bin").read_bytes() == data
            assert run.volume_file("out", "curl.bin").read_bytes() == data
            stats = run.stats(admin_port)
            assert (stats["misses"], stats["hits"]) == (1, 1), stats
            assert stats["bytes_from_buffer"] == DATA_SIZE, stats
            requests = origin_requests(base, tmp_path / "origin-ca.pem")
            assert requests == {"/files/data.bin": 1}, requests

            # The sidecar ran as the patch describes it, not as the image defaults.
            inspected = json.loads(
                docker.run("inspect", run.container_name(names.CONTAINER)).stdout
            )[0]
            assert inspected["Config"]["User"] == "65532:65532"
            assert inspected["HostConfig"]["ReadonlyRootfs"] is True
            assert inspected["HostConfig"]["CapDrop"] == ["ALL"]
            assert inspected["State"]["Running"] is True
    finally:
        origin.terminate()
        origin.wait(10)
