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
from pathlib import Path

import pytest
import trustme

from injector import names
from tests.image.conftest import Images
from tests.image.dockerd import Docker
from tests.image.dockerpod import DockerPod
from tests.image.injected import (
    admin_port_of,
    origin_requests,
    plain_pod,
    render,
    sidecar_of,
    start_origin,
)

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.timeout(1800)]

APP_IMAGE = "debian:trixie"
HOST = "datasets.test"
DATA_SIZE = 3 * 2**20 + 4321  # not a multiple of any buffer size
ORIGIN_CA_CONFIG_MAP = "test-origin-ca"
CONFIG = f"upstreamCA: {{configMapName: {ORIGIN_CA_CONFIG_MAP}, key: ca.crt}}\n"


def test_injected_pod_downloads_through_the_image(
    docker: Docker,
    images: Images,
    network: tuple[str, str],
    origin_ca: trustme.CA,
    tmp_path: Path,
) -> None:
    network_name, node_ip = network
    data = random.Random(12).randbytes(DATA_SIZE)
    origin, base = start_origin(node_ip, origin_ca, HOST, data, tmp_path)
    url = f"https://{HOST}:{base.rsplit(':', 1)[1]}/files/data.bin"
    script = f"wget -q -O /out/wget.bin {url} && curl -sS --fail -o /out/curl.bin {url}"
    pod = plain_pod("train", HOST, script, APP_IMAGE)
    rendered = render(pod, CONFIG, tmp_path)
    sidecar = sidecar_of(rendered)
    admin_port = admin_port_of(sidecar)
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
