"""The image, with the memory limit the injector gives a two-worker sidecar, restarted on
a buffer of many stored objects and serving distinct hits from it without being killed.

The pod asks for two sidecar CPUs (two workers) and a `Disk` buffer, so that the
container's memory limit is the sidecar's own, not the buffer's. Its buffer volume is
filled before the sidecar starts, as after a container restart in the same pod, with
small objects made through the store's own API (`bench.stored`). The app container then
reads a distinct object per request over two kept-alive curl connections. No origin
runs: every answer must come from the buffer.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import stored
from injector import names
from injector.mutate import index_charge
from injector.quantity import parse_bytes
from tests.image.conftest import Images
from tests.image.dockerd import Docker
from tests.image.dockerpod import DockerPod
from tests.image.injected import admin_port_of, plain_pod, render, sidecar_of

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.timeout(1800)]

APP_IMAGE = "debian:trixie"
OBJECTS = 100_000  # stored before the sidecar starts
SIDECAR_UID = 65532  # the image's user, which the injected securityContext names
# The memory limit the injector gives a sidecar of two workers on a 2Gi volume (its
# default: 256Mi for one worker, 128Mi for each further one, and the shared memory of the
# core's table of answers for that buffer, which every object read here takes a place in).
TWO_WORKER_LIMIT = parse_bytes("384Mi") + index_charge(parse_bytes("2Gi"))


def reader_script(shards: int) -> str:
    """Read every stored object once, `shards` curl processes each on one connection,
    each answer's status in /out/<shard>.codes."""
    url = f'url = "https://{stored.HOST}/files/img-%07g.jpg"\noutput = "/dev/null"'
    steps = [
        f"seq -f '{url}' {shard} {shards} {OBJECTS - 1} > /out/{shard}.cfg"
        for shard in range(shards)
    ]
    steps += [
        f"curl -sS -K /out/{shard}.cfg -w '%{{http_code}}\\n' > /out/{shard}.codes &"
        for shard in range(shards)
    ]
    return "\n".join([*steps, "wait"])


def fill_buffer(volume: Path) -> None:
    """The stored objects, copied into the pod's buffer volume as the sidecar's user."""
    source, _ = stored.buffer(OBJECTS)
    shutil.copytree(source, volume, dirs_exist_ok=True)
    subprocess.run(["chown", "-R", f"{SIDECAR_UID}:{SIDECAR_UID}", str(volume)], check=True)


def test_a_full_buffer_serves_distinct_hits_within_the_injected_limit(
    docker: Docker, images: Images, network: tuple[str, str], tmp_path: Path
) -> None:
    network_name, node_ip = network
    shards = 2
    pod = plain_pod("loader", stored.HOST, reader_script(shards), APP_IMAGE)
    pod["metadata"]["annotations"].update(
        {names.SIDECAR_CPU: "2", names.BUFFER_MEDIUM: "Disk", names.BUFFER_SIZE: "2Gi"}
    )
    rendered = render(pod, "{}\n", tmp_path)
    sidecar = sidecar_of(rendered)
    assert parse_bytes(sidecar["resources"]["limits"]["memory"]) == TWO_WORKER_LIMIT
    admin_port = admin_port_of(sidecar)
    run = DockerPod(
        docker,
        rendered,
        images={sidecar["image"]: images.burstbuffer, APP_IMAGE: images.app},
        sandbox_image=images.base,
        workdir=tmp_path / "pod",
        hosts={stored.HOST: node_ip},
        network=network_name,
    )
    with run:
        fill_buffer(run.volume_file(names.BUFFER_VOLUME, ""))
        run.start()
        code = run.wait("app", timeout=900)
        assert code == 0, run.logs("app") + run.logs(names.CONTAINER)

        codes = [
            run.volume_file("out", f"{shard}.codes").read_text().split() for shard in range(shards)
        ]
        assert sum(len(c) for c in codes) == OBJECTS
        assert all(status == "200" for c in codes for status in c)
        stats = run.stats(admin_port)
        assert (stats["hits"], stats["misses"], stats["upstream_requests"]) == (OBJECTS, 0, 0)
        assert stats["entries"] == OBJECTS

        state = json.loads(docker.run("inspect", run.container_name(names.CONTAINER)).stdout)[0]
        assert state["HostConfig"]["Memory"] == TWO_WORKER_LIMIT
        assert state["State"]["Running"] is True
        assert state["State"]["OOMKilled"] is False
        assert "restarting" not in run.logs(names.CONTAINER)  # no worker was killed either
