"""The product end to end: an injected pod, run as the kubelet would, downloads via its sidecar.

Each test writes a plain pod (app containers running unmodified wget, curl or Python in a
Debian bookworm root, as UID 1000), injects it with `burstbuffer-injector render` (the
real entry point), and runs the result with `podrun.PodRun`, which reads the pod and
does what it says. The test origin is `bench.origin` on 127.0.0.1:443 inside the pod's
network namespace, named `datasets.test` by the pod's own hostAliases and intercepted by
the pod's own `burstbuffer.io/intercept` annotation.

One thing the pod does not say: the origin's certificate comes from a private test CA,
which the harness mounts into the sidecar at /run/harness/origin-ca.pem and names with an
appended `--upstream-ca` (a real dataset host has a public certificate).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from podrun import DEBIAN_PATH, Image, PodRun, debian_rootfs

from injector import names

pytestmark = [pytest.mark.e2e, pytest.mark.root]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
APP_IMAGE = "debian:bookworm"
SIDECAR_IMAGE = "ghcr.io/burstbuffer/burstbuffer:0.1.0"
HOST = "datasets.test"
URL = f"https://{HOST}/files/data.bin"
DATA_SIZE = 6 * 2**20 + 12345  # not a multiple of any buffer size
ORIGIN_CA_PATH = "/run/harness/origin-ca.pem"


@pytest.fixture(scope="module")
def images() -> dict[str, Image]:
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces, mounts, chroot and setpriv")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "burstbuffer"
    return {
        APP_IMAGE: Image(debian_rootfs(cache), {"PATH": DEBIAN_PATH}),
        # The sidecar image, as far as this machine can have it: the host's root (read
        # only) with the project's venv, USER 65532 as in the Dockerfile.
        SIDECAR_IMAGE: Image(
            Path("/"),
            {"PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin"},
            user=65532,
            traverse=closed_ancestors(Path(sys.executable).resolve()),
        ),
    }


def closed_ancestors(path: Path) -> tuple[str, ...]:
    """Directories above `path` that others may not traverse (e.g. /root, for pyenv)."""
    return tuple(str(p) for p in path.parents if not p.stat().st_mode & 0o001)


@dataclass
class Origin:
    ca_pem: Path
    data: bytes
    process: subprocess.Popen[bytes]

    def requests(self, pod: PodRun) -> dict[str, Any]:
        status, body = pod.get("https://127.0.0.1/__requests", cafile=self.ca_pem)
        assert status == 200
        return json.loads(body)["requests"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dataset")
    (directory / "data.bin").write_bytes(random.Random(7).randbytes(DATA_SIZE))
    directory.chmod(0o755)
    return directory


def start_origin(pod: PodRun, ca: trustme.CA, dataset: Path, tmp: Path) -> Origin:
    """bench.origin on 127.0.0.1:443 in the pod's network namespace, certified for HOST."""
    cert = ca.issue_cert(HOST, "127.0.0.1")
    cert_pem, key_pem, ca_pem = tmp / "origin.pem", tmp / "origin.key", tmp / "origin-ca.pem"
    cert.private_key_pem.write_to_path(str(key_pem))
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    ca.cert_pem.write_to_path(str(ca_pem))
    ca_pem.chmod(0o644)
    tmp.chmod(0o755)
    argv = ["ip", "netns", "exec", pod.netns, sys.executable, "-m", "bench.origin"]
    argv += ["--dir", str(dataset), "--host", "127.0.0.1", "--port", "443"]
    argv += ["--cert", str(cert_pem), "--key", str(key_pem)]
    log = open(tmp / "origin.log", "wb")
    process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    origin = Origin(ca_pem, (dataset / "data.bin").read_bytes(), process)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            origin.requests(pod)
            return origin
        except OSError:
            assert process.poll() is None, (tmp / "origin.log").read_text()
            time.sleep(0.1)
    raise AssertionError("the test origin did not start")


def app_pod(name: str, containers: list[dict[str, Any]], **annotations: str) -> dict[str, Any]:
    """A plain pod, as a user writes it: the test host is intercepted by annotation."""
    for container in containers:
        container.setdefault("image", APP_IMAGE)
        container.setdefault("volumeMounts", [{"name": "out", "mountPath": "/out"}])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {names.INTERCEPT: HOST, **annotations},
        },
        "spec": {
            "restartPolicy": "Never",
            "hostAliases": [{"ip": "127.0.0.1", "hostnames": [HOST]}],
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "containers": containers,
            "volumes": [{"name": "out", "emptyDir": {}}],
        },
    }


def render(pod: dict[str, Any], tmp: Path, config: str | None = None) -> dict[str, Any]:
    """`burstbuffer-injector render`, the command a user runs."""
    argv = [str(VENV_BIN / "burstbuffer-injector"), "render"]
    if config is not None:
        (tmp / "config.yaml").write_text(config)
        argv += ["--config", str(tmp / "config.yaml")]
    done = subprocess.run(
        argv, input=yaml.safe_dump(pod).encode(), capture_output=True, timeout=60, check=True
    )
    rendered = yaml.safe_load(done.stdout)
    assert isinstance(rendered, dict)
    return rendered


def sidecar_of(pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod["spec"]
    for container in (spec.get("initContainers") or []) + spec["containers"]:
        if container["name"] == names.CONTAINER:
            return container
    raise AssertionError("no sidecar in the rendered pod")


def admin_port(pod: dict[str, Any]) -> int:
    port = next(p for p in sidecar_of(pod)["ports"] if p["name"] == names.ADMIN_PORT_NAME)
    return int(port["containerPort"])


def volume_of(pod: dict[str, Any], mount_path: str) -> str:
    """The volume the sidecar mounts at `mount_path` (the patch's choice of name)."""
    mounts = sidecar_of(pod)["volumeMounts"]
    return str(next(m["name"] for m in mounts if m["mountPath"] == mount_path))


@pytest.fixture
def run_pod(
    images: dict[str, Image], origin_ca: trustme.CA, dataset: Path, tmp_path: Path
) -> Iterator[Any]:
    """Start a rendered pod with the test origin beside it: `pod, origin = run_pod(rendered)`."""
    started: list[PodRun] = []
    origins: list[Origin] = []

    def run(rendered: dict[str, Any]) -> tuple[PodRun, Origin]:
        base = tmp_path / f"pod{len(started)}"
        base.mkdir()
        base.chmod(0o755)
        origin_dir = base / "origin"
        origin_dir.mkdir()
        pod = PodRun(rendered, images, base / "run", extra_args={})
        pod.__enter__()
        started.append(pod)
        origin = start_origin(pod, origin_ca, dataset, origin_dir)
        origins.append(origin)
        # The one addition to the pod: the test origin's private CA, for the sidecar.
        sidecars = (names.CONTAINER, names.INIT_CONTAINER)
        pod.extra_files = {name: {ORIGIN_CA_PATH: origin.ca_pem} for name in sidecars}
        pod.extra_args = {name: ["--upstream-ca", ORIGIN_CA_PATH] for name in sidecars}
        pod.start()
        return pod, origin

    yield run
    for pod in started:
        pod.stop()
    for origin in origins:
        origin.process.terminate()
        origin.process.wait(10)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


TWICE = {
    "wget": f"wget -q -O /out/first {URL} && wget -q -O /out/second {URL}",
    "curl": f"curl -sS --fail -o /out/first {URL} && curl -sS --fail -o /out/second {URL}",
    "urllib": (
        "python3 -c 'import shutil, sys, urllib.request\n"
        'for name in ("first", "second"):\n'
        f'    with urllib.request.urlopen("{URL}", timeout=60) as r, '
        'open("/out/" + name, "wb") as f:\n'
        "        shutil.copyfileobj(r, f)\n'"
    ),
}


@pytest.mark.parametrize("client", sorted(TWICE))
def test_unmodified_client_downloads_through_the_sidecar(
    client: str, run_pod: Any, tmp_path: Path
) -> None:
    pod_spec = app_pod(f"{client}-pod", [{"name": "app", "command": ["sh", "-c", TWICE[client]]}])
    rendered = render(pod_spec, tmp_path)
    pod, origin = run_pod(rendered)

    assert pod.wait("app") == 0, pod.log("app") + pod.log(names.CONTAINER)
    out = pod.volume_dir("out")
    for name in ("first", "second"):
        assert sha256((out / name).read_bytes()) == sha256(origin.data), name
    stats = pod.stats(admin_port(rendered))
    assert stats["misses"] == 1 and stats["hits"] == 1, stats
    assert stats["bytes_from_buffer"] == DATA_SIZE, stats
    # The origin saw the file once: the second download never left the pod.
    assert origin.requests(pod) == {"/files/data.bin": 1}


SCAN = """
import os, sys
needle = sys.argv[1].encode()
found = []
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/dev")]
    for name in files:
        path = os.path.join(top, name)
        try:
            with open(path, "rb") as f:
                if needle in f.read(4 << 20):
                    found.append(path)
        except OSError:
            pass
print("\\n".join(found))
"""


def pem_body_line(pem: str, label: str) -> str:
    """A line from the middle of the base64 body of the first `label` block in `pem`."""
    lines = pem.split(f"-----BEGIN {label}-----", 1)[1].split("-----END", 1)[0].split()
    return lines[len(lines) // 2]


def test_app_container_cannot_read_the_ca_key(run_pod: Any, tmp_path: Path) -> None:
    # A container that stays up, to look around in with the pod's own user, mounts and env.
    pod_spec = app_pod("snoop", [{"name": "shell", "command": ["sleep", "3600"]}])
    rendered = render(pod_spec, tmp_path)
    pod, _ = run_pod(rendered)

    ca_dir = pod.volume_dir(volume_of(rendered, names.CA_DIR))
    files = [p for p in ca_dir.rglob("*") if p.is_file()]
    keys = [p.read_text() for p in files if "PRIVATE KEY-----" in p.read_text()]
    assert keys, f"no CA key in the sidecar's CA volume: {files}"
    label = "RSA PRIVATE KEY" if "BEGIN RSA PRIVATE KEY" in keys[0] else "PRIVATE KEY"
    trust_dir = pod.volume_dir(volume_of(rendered, names.TRUST_DIR))
    certificate = (trust_dir / names.CA_FILE).read_text()

    def scan(needle: str) -> list[str]:
        done = pod.exec("shell", ["python3", "-c", SCAN, needle], timeout=240)
        assert done.returncode == 0, done.stdout
        return done.stdout.decode().split()

    # Control: the scan does see through the mounts, and finds the pod CA's certificate.
    seen = scan(pem_body_line(certificate, "CERTIFICATE"))
    assert "/etc/burstbuffer/trust/ca.crt" in seen, seen
    assert "/etc/ssl/certs/ca-certificates.crt" in seen, seen
    # The key is nowhere the app can read, and the sidecar's CA directory is not there.
    assert scan(pem_body_line(keys[0], label)) == []
    done = pod.exec("shell", ["ls", names.CA_DIR])
    assert done.returncode != 0, done.stdout


def test_pods_own_init_containers_download_through_the_native_sidecar(
    run_pod: Any, tmp_path: Path
) -> None:
    pod_spec = app_pod("init", [{"name": "app", "command": ["sh", "-c", TWICE["curl"]]}])
    pod_spec["spec"]["initContainers"] = [
        {
            "name": "prefetch",
            "image": APP_IMAGE,
            "command": ["wget", "-q", "-O", "/out/init", URL],
            "volumeMounts": [{"name": "out", "mountPath": "/out"}],
        }
    ]
    rendered = render(pod_spec, tmp_path)
    pod, origin = run_pod(rendered)

    assert pod.wait("app") == 0, pod.log("app")
    out = pod.volume_dir("out")
    for name in ("init", "first", "second"):
        assert (out / name).read_bytes() == origin.data, name
    stats = pod.stats(admin_port(rendered))
    assert stats["misses"] == 1 and stats["hits"] == 2, stats
    assert origin.requests(pod) == {"/files/data.bin": 1}


def test_classic_sidecar_primes_trust_for_init_containers_then_proxies(
    run_pod: Any, tmp_path: Path
) -> None:
    pod_spec = app_pod("classic", [{"name": "app", "command": ["sh", "-c", TWICE["urllib"]]}])
    pod_spec["spec"]["initContainers"] = [
        {
            # Before the classic sidecar exists: trust, but no proxy (a direct download).
            "name": "prefetch",
            "image": APP_IMAGE,
            "command": ["sh", "-c", f'[ -z "$https_proxy" ] && wget -q -O /out/init {URL}'],
            "volumeMounts": [{"name": "out", "mountPath": "/out"}],
        }
    ]
    rendered = render(pod_spec, tmp_path, config="nativeSidecar: false\n")
    assert rendered["spec"]["initContainers"][0]["name"] == names.INIT_CONTAINER
    assert rendered["spec"]["containers"][0]["name"] == names.CONTAINER
    pod, origin = run_pod(rendered)

    assert pod.wait("app") == 0, pod.log("app") + pod.log(names.CONTAINER)
    out = pod.volume_dir("out")
    for name in ("init", "first", "second"):
        assert (out / name).read_bytes() == origin.data, name
    stats = pod.stats(admin_port(rendered))
    assert stats["misses"] == 1 and stats["hits"] == 1, stats
    # One direct download by the init container, one fill by the sidecar.
    assert origin.requests(pod) == {"/files/data.bin": 2}


def test_restarted_sidecar_keeps_its_ca_and_its_buffer(run_pod: Any, tmp_path: Path) -> None:
    pod_spec = app_pod("restart", [{"name": "shell", "command": ["sleep", "3600"]}])
    rendered = render(pod_spec, tmp_path)
    pod, origin = run_pod(rendered)
    trust = pod.volume_dir(volume_of(rendered, names.TRUST_DIR))
    before = {name: (trust / name).read_bytes() for name in (names.CA_FILE, names.BUNDLE_FILE)}

    def download(name: str) -> None:
        done = pod.exec("shell", ["curl", "-sS", "--fail", "-o", f"/out/{name}", URL])
        assert done.returncode == 0, done.stdout
        assert (pod.volume_dir("out") / name).read_bytes() == origin.data

    download("before")
    pod.restart(names.CONTAINER)
    # The app still trusts the restarted sidecar (its bundle was pinned at start), and the
    # object stored before the restart is served from the buffer.
    download("after")
    assert {name: (trust / name).read_bytes() for name in before} == before
    stats = pod.stats(admin_port(rendered))
    assert stats["hits"] == 1 and stats["misses"] == 0, stats
    assert origin.requests(pod) == {"/files/data.bin": 1}


def test_stage_in_annotation_prefetches_before_the_app_asks(run_pod: Any, tmp_path: Path) -> None:
    once = f"curl -sS --fail -o /out/first {URL}"
    pod_spec = app_pod(
        "stage-in",
        [{"name": "app", "command": ["sh", "-c", once]}],
        **{names.STAGE_IN: URL},
    )
    rendered = render(pod_spec, tmp_path)
    pod, origin = run_pod(rendered)

    assert pod.wait("app") == 0, pod.log("app")
    assert (pod.volume_dir("out") / "first").read_bytes() == origin.data
    stats = pod.stats(admin_port(rendered))
    # The app's one download was served by the staged fill (a hit, or joined in progress).
    assert stats["misses"] == 0, stats
    assert origin.requests(pod) == {"/files/data.bin": 1}
