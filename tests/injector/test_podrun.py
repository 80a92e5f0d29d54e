"""The product end to end: an injected pod, run as the kubelet would, downloads via its sidecar.

Each test writes a plain pod (app containers running unmodified wget, curl, Python's
urllib, requests or pip in a Debian bookworm root, as UID 1000), injects it with
`burstbuffer-injector render` (the real entry point), and runs the result with
`podrun.PodRun`, which reads the pod and does what it says. The test origin is
`bench.origin` on 127.0.0.2:443 inside the pod's network namespace, named `datasets.test`
by a DNS server on 127.0.0.53 there (the pod's dnsConfig names it; the hostAliases
capture needs the name in DNS, since it maps it to the sidecar in /etc/hosts), and
intercepted by the pod's own `burstbuffer.io/intercept` annotation.

The origin's certificate comes from a private test CA: the injector is configured with
`upstreamCA` naming a ConfigMap that holds it, which the harness supplies as the API
server would (a real dataset host has a public certificate).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from dnsserver import DnsServer
from podrun import DEBIAN_PATH, Image, PodRun, debian_rootfs, in_netns

from injector import names
from sidecar.settings import CAPTURE_MODES

pytestmark = [pytest.mark.e2e, pytest.mark.root]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
APP_IMAGE = "debian:bookworm"
SIDECAR_IMAGE = "ghcr.io/burstbuffer/burstbuffer:0.1.0"
HOST = "datasets.test"
ORIGIN_IP = "127.0.0.2"
DNS_IP = "127.0.0.53"
URL = f"https://{HOST}/files/data.bin"
DATA_SIZE = 6 * 2**20 + 12345  # not a multiple of any buffer size
WHEEL = "bbdemo-1.0-py3-none-any.whl"
WHEEL_URL = f"https://{HOST}/files/{WHEEL}"
ORIGIN_CA_CONFIG_MAP = "test-origin-ca"
# Every pod's injector configuration: the test origin's CA for the sidecar.
BASE_CONFIG = f"upstreamCA: {{configMapName: {ORIGIN_CA_CONFIG_MAP}, key: ca.crt}}\n"


@pytest.fixture(scope="module")
def images() -> dict[str, Image]:
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces, mounts, chroot and setpriv")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "burstbuffer"
    return {
        APP_IMAGE: Image(debian_rootfs(cache), {"PATH": DEBIAN_PATH}),
        # The sidecar image, as far as this machine can have it: the host's root (read
        # only) with the project's venv and iptables on the PATH, USER 65532, as in the
        # Dockerfile.
        SIDECAR_IMAGE: Image(
            Path("/"),
            {"PATH": f"{VENV_BIN}:{DEBIAN_PATH}"},
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
        # By address, without SNI: with the transparent capture this root-owned connection
        # is redirected too, and the sidecar tunnels it untouched.
        status, body = pod.get(f"https://{ORIGIN_IP}/__requests", cafile=self.ca_pem)
        assert status == 200
        return json.loads(body)["requests"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dataset")
    (directory / "data.bin").write_bytes(random.Random(7).randbytes(DATA_SIZE))
    (directory / WHEEL).write_bytes(wheel())
    directory.chmod(0o755)
    return directory


def wheel() -> bytes:
    """A small valid wheel, with 1 MiB of incompressible payload, for pip to download."""
    files = {
        "bbdemo/__init__.py": b"",
        "bbdemo/payload.bin": random.Random(8).randbytes(2**20),
        "bbdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: bbdemo\nVersion: 1.0\n",
        "bbdemo-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: burstbuffer-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},sha256={digest(data)},{len(data)}\n" for name, data in files.items())
    files["bbdemo-1.0.dist-info/RECORD"] = (record + "bbdemo-1.0.dist-info/RECORD,,\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def start_origin(pod: PodRun, ca: trustme.CA, dataset: Path, tmp: Path) -> Origin:
    """bench.origin on ORIGIN_IP:443 in the pod's network namespace, certified for HOST."""
    cert = ca.issue_cert(HOST, ORIGIN_IP)
    cert_pem, key_pem, ca_pem = tmp / "origin.pem", tmp / "origin.key", tmp / "origin-ca.pem"
    cert.private_key_pem.write_to_path(str(key_pem))
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    ca.cert_pem.write_to_path(str(ca_pem))
    ca_pem.chmod(0o644)
    tmp.chmod(0o755)
    argv = ["ip", "netns", "exec", pod.netns, sys.executable, "-m", "bench.origin"]
    argv += ["--dir", str(dataset), "--host", ORIGIN_IP, "--port", "443"]
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


def start_dns(pod: PodRun) -> DnsServer:
    """The pod's DNS server (DNS_IP:53 in its network namespace), naming the origin."""

    def bind() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((DNS_IP, 53))
        return sock

    return DnsServer(in_netns(pod.netns, bind), {HOST: ORIGIN_IP})


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
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": [DNS_IP]},
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "containers": containers,
            "volumes": [{"name": "out", "emptyDir": {}}],
        },
    }


def render(pod: dict[str, Any], tmp: Path, config: str = "") -> dict[str, Any]:
    """`burstbuffer-injector render`, the command a user runs (BASE_CONFIG + `config`)."""
    (tmp / "config.yaml").write_text(BASE_CONFIG + config)
    argv = [str(VENV_BIN / "burstbuffer-injector"), "render", "--config", str(tmp / "config.yaml")]
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
    servers: list[DnsServer] = []

    def run(rendered: dict[str, Any]) -> tuple[PodRun, Origin]:
        base = tmp_path / f"pod{len(started)}"
        base.mkdir()
        base.chmod(0o755)
        origin_dir = base / "origin"
        origin_dir.mkdir()
        config_maps = {ORIGIN_CA_CONFIG_MAP: {"ca.crt": origin_ca.cert_pem.bytes().decode()}}
        pod = PodRun(rendered, images, base / "run", config_maps=config_maps)
        pod.__enter__()
        started.append(pod)
        servers.append(start_dns(pod))
        origin = start_origin(pod, origin_ca, dataset, origin_dir)
        origins.append(origin)
        pod.start()
        return pod, origin

    yield run
    for pod in started:
        pod.stop()
    for server in servers:
        server.close()
    for origin in origins:
        origin.process.terminate()
        origin.process.wait(10)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


PY_TWICE = (
    "python3 -c 'import shutil\n{imports}\n"
    'for name in ("first", "second"):\n'
    f'    with {{open}}("{URL}"{{args}}) as r, open("/out/" + name, "wb") as f:\n'
    "        shutil.copyfileobj(r{raw}, f)\n'"
)
PIP_DOWNLOAD = (
    "pip download --no-deps --no-cache-dir --disable-pip-version-check --quiet -d /out/{name} "
    + WHEEL_URL
)
# Each client downloads a dataset file twice, as its users write it.
TWICE = {
    "wget": f"wget -q -O /out/first {URL} && wget -q -O /out/second {URL}",
    "curl": f"curl -sS --fail -o /out/first {URL} && curl -sS --fail -o /out/second {URL}",
    "urllib": PY_TWICE.format(
        imports="import urllib.request", open="urllib.request.urlopen", args=", timeout=60", raw=""
    ),
    "requests": PY_TWICE.format(
        imports="import requests",
        open="requests.get",
        args=", stream=True, timeout=60",
        raw=".raw",
    ),
    "pip": " && ".join(PIP_DOWNLOAD.format(name=name) for name in ("first", "second")),
}


def downloaded(out: Path, client: str, name: str) -> bytes:
    """The file a client wrote: pip keeps the wheel's name in the directory it was given."""
    return (out / name / WHEEL if client == "pip" else out / name).read_bytes()


@pytest.mark.parametrize("mode", CAPTURE_MODES)
@pytest.mark.parametrize("client", list(TWICE))
def test_unmodified_client_downloads_through_the_sidecar(
    client: str, mode: str, run_pod: Any, tmp_path: Path, dataset: Path
) -> None:
    pod_spec = app_pod(f"{client}-pod", [{"name": "app", "command": ["sh", "-c", TWICE[client]]}])
    rendered = render(pod_spec, tmp_path, config=f"capture: {mode}\n")
    app_env = {e["name"] for e in rendered["spec"]["containers"][0]["env"]}
    # Only proxy-env sets proxy variables: the other modes capture without them.
    assert ("https_proxy" in app_env) == (mode == "proxy-env"), app_env
    pod, origin = run_pod(rendered)

    assert pod.wait("app") == 0, pod.log("app") + pod.log(names.CONTAINER)
    name = WHEEL if client == "pip" else "data.bin"
    expected = (dataset / name).read_bytes()
    out = pod.volume_dir("out")
    for copy in ("first", "second"):
        assert sha256(downloaded(out, client, copy)) == sha256(expected), copy
    stats = pod.stats(admin_port(rendered))
    assert stats["misses"] == 1 and stats["hits"] == 1, stats
    assert stats["bytes_from_buffer"] == len(expected), stats
    # The origin saw the file once: the second download never left the pod.
    assert origin.requests(pod) == {f"/files/{name}": 1}


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


@pytest.mark.parametrize("mode", CAPTURE_MODES)
def test_pods_own_init_containers_download_through_the_native_sidecar(
    mode: str, run_pod: Any, tmp_path: Path
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
    rendered = render(pod_spec, tmp_path, config=f"capture: {mode}\n")
    pod, origin = run_pod(rendered)

    assert pod.wait("app") == 0, pod.log("app")
    out = pod.volume_dir("out")
    for name in ("init", "first", "second"):
        assert (out / name).read_bytes() == origin.data, name
    stats = pod.stats(admin_port(rendered))
    assert stats["misses"] == 1 and stats["hits"] == 2, stats
    assert origin.requests(pod) == {"/files/data.bin": 1}


# Not hostAliases: its /etc/hosts entries send the init containers to a sidecar that
# does not run yet (the injector warns).
@pytest.mark.parametrize("mode", ["proxy-env", "transparent"])
def test_classic_sidecar_primes_trust_for_init_containers_then_captures(
    mode: str, run_pod: Any, tmp_path: Path
) -> None:
    pod_spec = app_pod("classic", [{"name": "app", "command": ["sh", "-c", TWICE["urllib"]]}])
    pod_spec["spec"]["initContainers"] = [
        {
            # Before the classic sidecar exists: trust, but no proxy and no redirect yet (a
            # direct download).
            "name": "prefetch",
            "image": APP_IMAGE,
            "command": ["sh", "-c", f'[ -z "$https_proxy" ] && wget -q -O /out/init {URL}'],
            "volumeMounts": [{"name": "out", "mountPath": "/out"}],
        }
    ]
    rendered = render(pod_spec, tmp_path, config=f"nativeSidecar: false\ncapture: {mode}\n")
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
