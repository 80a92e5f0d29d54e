"""The Docker daemon and the images of the image tests, made once per session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.image.dockerd import (
    BUILD_TIMEOUT,
    Docker,
    DockerUnavailable,
    base_image,
    build_project_image,
    build_squid_image,
    prune_replaced,
)
from tests.image.dockerpod import internal_network

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
    burstbuffer = build_project_image(docker)
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
    return build_squid_image(docker)


@pytest.fixture
def network(docker: Docker) -> Iterator[tuple[str, str]]:
    """A pod network with no route out: (its name, the node's address on it)."""
    with internal_network(docker) as made:
        yield made
