"""The images the cluster runs, made here and imported into its containerd: no registry.

Under the names and tags the chart's defaults use, so that a plain `helm install` runs:
the project's image (the Dockerfile, as the image test builds it) and the parent tier's
Squid (Dockerfile.squid); beside them the pod sandbox's pause, and `debian:bookworm` for
app pods, made from the local Debian root with wget, curl and Python 3. They are built
with a Docker daemon (started for the occasion when none answers) and moved into
containerd's `k8s.io` namespace, the one its CRI plugin serves the kubelet from, as
`kind load` does.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from bench.cachedir import cache_dir
from tests.cluster.build import bin_dir
from tests.cluster.components import PAUSE_IMAGE
from tests.cluster.layout import ROOT, Layout
from tests.image.dockerd import Docker, build_project_image, build_squid_image, import_root
from tests.injector.podrun import debian_rootfs

APP_IMAGE = "debian:bookworm"
CHART = ROOT / "charts" / "burstbuffer"
IMPORT_TIMEOUT = 600.0  # seconds: the project's image is about 300 MB


def chart_images() -> tuple[str, str]:
    """The project's and Squid's image names as the chart's defaults spell them."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    project = f"{values['image']['repository']}:{values['image']['tag'] or version}"
    squid = values["parentCache"]["image"]
    return project, f"{squid['repository']}:{squid['tag']}"


def build_images(docker: Docker) -> list[str]:
    """Build (or find in Docker's cache) and name every image of the cluster; the names."""
    project, squid = chart_images()
    docker.run("tag", build_project_image(docker), project)
    docker.run("tag", build_squid_image(docker), squid)
    import_root(docker, debian_rootfs(cache_dir()), APP_IMAGE)
    with tempfile.TemporaryDirectory() as root:
        # A root holding only the static pause binary.
        shutil.copy(bin_dir() / "pause", Path(root) / "pause")
        import_root(docker, Path(root), PAUSE_IMAGE, 'ENTRYPOINT ["/pause"]')
    return [project, squid, APP_IMAGE, PAUSE_IMAGE]


def prepare_images() -> list[str]:
    """Build every image ahead of the cluster (what takes minutes the first time)."""
    docker = Docker.find_or_start()
    try:
        return build_images(docker)
    finally:
        docker.stop()


def import_images(layout: Layout) -> list[str]:
    """Build the images and import them into the cluster's containerd; their names."""
    docker = Docker.find_or_start()
    try:
        names = build_images(docker)
        save = subprocess.Popen(["docker", "save", *names], env=docker.env, stdout=subprocess.PIPE)
        assert save.stdout is not None
        done = subprocess.run(
            ["ctr", "--address", str(layout.containerd_socket), "--namespace", "k8s.io",
             "images", "import", "--digests", "--snapshotter", "overlayfs", "-"],
            stdin=save.stdout, capture_output=True, timeout=IMPORT_TIMEOUT,
        )  # fmt: skip
        save.stdout.close()
        if save.wait(IMPORT_TIMEOUT) != 0 or done.returncode != 0:
            raise RuntimeError(f"importing {names} failed: {done.stderr.decode()[-2000:]}")
        return names
    finally:
        docker.stop()
