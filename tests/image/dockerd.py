"""A Docker daemon for the image tests, and the images they build without a registry.

`Docker.find_or_start` uses the daemon the environment names (DOCKER_HOST or the default
socket) if it answers, and otherwise starts Debian's `dockerd` (package docker.io) as
root with its state in the test cache, so that imported and built images and their
layers are kept from one run to the next; the daemon it started is stopped at the end.

No registry is reached: the base image is a Debian root made by `debootstrap` and
`docker import`ed (tagged by its package list, so it is made once per cache), and
every other image is built FROM it. What pip needs to reach its index from inside
`docker build` (the index URL and the CAs this machine adds to the public ones) is
read from pip's own configuration and passed as build arguments.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.cachedir import cache_dir
from tests.injector.podrun import debian_rootfs
from tests.registries import package_manager_env

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0  # seconds for a started dockerd to answer
BUILD_TIMEOUT = 900.0  # seconds: a first build downloads the dependencies
STOP_GRACE = 30.0
RUN_DIR = Path("/run/burstbuffer-test")  # the socket and runtime state of a started dockerd
# The base: a Debian whose own Python is >= 3.12, laid out as the Dockerfile expects of
# any BASE (`python` with venv, the public roots for pip, apt for the runtime stage).
BASE_SUITE = "trixie"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
PUBLIC_ROOTS = "/etc/ssl/certs/ca-certificates.crt"
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


class DockerUnavailable(RuntimeError):
    """No daemon answers and none could be started here; the message says why."""


@dataclass
class Docker:
    """A docker client bound to one daemon; `stop()` ends the daemon if we started it."""

    env: dict[str, str]
    daemon: subprocess.Popen[bytes] | None = None

    @classmethod
    def find_or_start(cls) -> Docker:
        if shutil.which("docker") is None:
            raise DockerUnavailable("no docker client on PATH")
        ambient = cls(dict(os.environ))
        if ambient.answers():
            return ambient
        # One a test run that was killed left running: it is ours, so it is reused.
        left = cls({**os.environ, "DOCKER_HOST": f"unix://{RUN_DIR}/docker.sock"})
        if left.answers():
            return left
        dockerd = shutil.which("dockerd") or shutil.which("/usr/sbin/dockerd")
        if dockerd is None:
            raise DockerUnavailable("no Docker daemon answers and dockerd is not installed")
        if os.geteuid() != 0:
            raise DockerUnavailable("no Docker daemon answers, and starting one needs root")
        return cls._start(dockerd)

    @classmethod
    def _start(cls, dockerd: str) -> Docker:
        state = cache_dir("docker")
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        log = state / "dockerd.log"
        socket = f"unix://{RUN_DIR}/docker.sock"
        argv = [dockerd, "--data-root", str(state / "data"), "--exec-root", str(RUN_DIR / "exec")]
        argv += ["--pidfile", str(RUN_DIR / "dockerd.pid"), "--host", socket]
        with open(log, "wb") as output:
            daemon = subprocess.Popen(
                argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        docker = cls({**os.environ, "DOCKER_HOST": socket}, daemon)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if daemon.poll() is not None:
                break
            if docker.answers():
                return docker
            time.sleep(0.5)
        docker.stop()
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise DockerUnavailable(f"dockerd did not start: {' / '.join(tail)}")

    def answers(self) -> bool:
        done = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            env=self.env, capture_output=True, timeout=30,
        )  # fmt: skip
        return done.returncode == 0

    def stop(self) -> None:
        """Stop the daemon if this object started it (SIGTERM: it stops its containers)."""
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait(10)

    def run(
        self, *args: str, check: bool = True, timeout: float = 120.0, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            ["docker", *args], env=self.env, input=stdin, capture_output=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"docker {' '.join(args[:3])} ... exited {done.returncode}: "
                f"{done.stderr.decode(errors='replace')[-3000:]}"
            )
        return done

    def has_image(self, name: str) -> bool:
        return self.run("image", "inspect", name, check=False).returncode == 0


def base_image(docker: Docker) -> str:
    """The local base (debootstrap + `docker import`), made once per package list."""
    key = hashlib.sha256(f"{BASE_SUITE}:{','.join(BASE_PACKAGES)}".encode()).hexdigest()[:12]
    name = f"burstbuffer-test/{BASE_SUITE}:{key}"
    if not docker.has_image(name):
        import_root(docker, debian_rootfs(cache_dir(), BASE_SUITE, BASE_PACKAGES), name)
    return name


def import_root(docker: Docker, root: Path, name: str, *changes: str) -> None:
    """A root file system `docker import`ed as the image `name` (`changes`: Dockerfile
    instructions such as ENTRYPOINT, as `docker import --change` takes them)."""
    # Package lists and downloaded .debs are not part of an image (as in Debian's own).
    tar = subprocess.Popen(
        ["tar", "-C", str(root), "--exclude=./var/lib/apt/lists/*",
         "--exclude=./var/cache/apt/*", "-c", "."],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert tar.stdout is not None
    options = [item for change in changes for item in ("--change", change)]
    done = subprocess.run(
        ["docker", "import", *options, "-", name], env=docker.env, stdin=tar.stdout,
        capture_output=True, timeout=300,
    )  # fmt: skip
    tar.stdout.close()
    assert tar.wait(60) == 0 and done.returncode == 0, done.stderr.decode(errors="replace")


def build_project_image(docker: Docker) -> str:
    """The project's Dockerfile built on the local base."""
    base = base_image(docker)
    arguments = ["--build-arg", f"BASE={base}", *pip_build_args(docker, base)]
    image = "burstbuffer-test/burstbuffer:dev"
    # The builder stage is tagged too, so that its layers (the installed dependencies)
    # are no dangling image and survive the prune below.
    for target, tag in (["--target", "builder"], f"{image}-builder"), ([], image):
        docker.run("build", *arguments, *target, "-t", tag, str(ROOT), timeout=BUILD_TIMEOUT)
    return image


def build_squid_image(docker: Docker) -> str:
    """Dockerfile.squid (the chart's parent cache) built on the local base."""
    image = "burstbuffer-test/squid:dev"
    docker.run(
        "build", "--build-arg", f"BASE={base_image(docker)}", "-t", image, "-",
        stdin=(ROOT / "Dockerfile.squid").read_bytes(), timeout=BUILD_TIMEOUT,
    )  # fmt: skip
    prune_replaced(docker)
    return image


def prune_replaced(docker: Docker) -> None:
    if docker.daemon is not None:
        # Our own daemon's store: what a rebuild replaced (about 0.3 GB a source change)
        # is of no further use.
        docker.run("image", "prune", "-f")


def pip_build_args(docker: Docker, base: str) -> list[str]:
    """`--build-arg`s that let pip in `docker build` reach the index this machine's pip uses.

    Read from pip's own configuration (files and PIP_* variables): a `file:` index is not
    usable inside the build and is left out. Of the CA bundle pip trusts, only the
    certificates the base does not already trust are passed (a whole bundle exceeds the
    size of one command-line argument).
    """
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
        timeout=60, env=package_manager_env(),
    ).stdout  # fmt: skip
    settings = dict(re.findall(r"^[^.\n]*\.([a-z-]+)='(.*)'$", listed, re.M))
    args = []
    index = settings.get("index-url", "")
    if index.startswith(("http://", "https://")):
        args += ["--build-arg", f"PIP_INDEX_URL={index}"]
    cert = Path(settings.get("cert", "/nonexistent"))
    if cert.is_file():
        roots = docker.run("run", "--rm", base, "cat", PUBLIC_ROOTS).stdout.decode()
        trusted = set(_PEM.findall(roots))
        extra = [pem for pem in _PEM.findall(cert.read_text()) if pem not in trusted]
        if extra:
            args += ["--build-arg", "PIP_CA=" + "\n".join(extra)]
    return args
