"""The Docker daemon and the images of the image tests, made once per session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.image.dockerd import Docker, DockerUnavailable, base_image, pip_build_args
from tests.image.dockerpod import internal_network

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 900.0  # seconds: a first build downloads the dependencies
# The app container's image: the base with the clients a training job would use.
APP_DOCKERFILE = b"""ARG BASE
FROM ${BASE}
RUN apt-get update \\
 && apt-get install -y --no-install-recommends wget curl \\
 && rm -rf /var/lib/apt/lists/*
"""


@dataclass(frozen=True)
class Images:
    base: str
    burstbuffer: str
    app: str


@pytest.fixture(scope="session")
def docker() -> Iterator[Docker]:
    try:
        docker = Docker.find_or_start()
    except DockerUnavailable as e:
        pytest.skip(f"no Docker daemon: {e}")
    yield docker
    docker.stop()


@pytest.fixture(scope="session")
def images(docker: Docker) -> Images:
    """The project's Dockerfile built on the local base, and the app image beside it."""
    base = base_image(docker)
    arguments = ["--build-arg", f"BASE={base}", *pip_build_args(docker, base)]
    burstbuffer = "burstbuffer-test/burstbuffer:dev"
    # The builder stage is tagged too, so that its layers (the installed dependencies)
    # are no dangling image and survive the prune below.
    for target, tag in (["--target", "builder"], f"{burstbuffer}-builder"), ([], burstbuffer):
        docker.run("build", *arguments, *target, "-t", tag, str(ROOT), timeout=BUILD_TIMEOUT)
    app = "burstbuffer-test/app:dev"
    docker.run(
        "build", "--build-arg", f"BASE={base}", "-t", app, "-",
        stdin=APP_DOCKERFILE, timeout=BUILD_TIMEOUT,
    )  # fmt: skip
    prune_replaced(docker)
    return Images(base, burstbuffer, app)


@pytest.fixture(scope="session")
def squid_image(docker: Docker) -> str:
    """Dockerfile.squid (the chart's parent cache) built on the local base."""
    squid = "burstbuffer-test/squid:dev"
    docker.run(
        "build", "--build-arg", f"BASE={base_image(docker)}", "-t", squid, "-",
        stdin=(ROOT / "Dockerfile.squid").read_bytes(), timeout=BUILD_TIMEOUT,
    )  # fmt: skip
    prune_replaced(docker)
    return squid


def prune_replaced(docker: Docker) -> None:
    if docker.daemon is not None:
        # Our own daemon's store: what a rebuild replaced (about 0.3 GB a source change)
        # is of no further use.
        docker.run("image", "prune", "-f")


@pytest.fixture
def network(docker: Docker) -> Iterator[tuple[str, str]]:
    """A pod network with no route out: (its name, the node's address on it)."""
    with internal_network(docker) as made:
        yield made
