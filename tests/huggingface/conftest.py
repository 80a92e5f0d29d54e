"""Real processes for the Hugging Face tests: a Hub of our own, the sidecar, the real clients.

- the Hub: a `bench.hub` process (the Hub, its Xet CAS and CDN, the LFS CDN) over the
  repositories of `_repositories`, with a trustme certificate for every Hub host; `hub`
  signs for an hour, `short_hub` for `SHORT_EXPIRY` seconds (a test can outlive its
  URLs), `multirange_hub` one v2 URL per xorb for all its ranges;
- the sidecar: `python -m sidecar` with its default intercept list (every Hub host is
  under `*.hf.co`) in its own mount namespace whose /etc/hosts maps those names to
  loopback, as in tests/sidecar;
- clients: `huggingface_hub` (`hf_hub_download`, `snapshot_download`) with `hf_xet`,
  unmodified, in a clean environment: `HF_ENDPOINT`, a `HF_HOME` of its own (a new one
  for each download: a new worker or container has an empty cache), and either the
  sidecar's proxy and trust bundle (`HTTPS_PROXY`, `SSL_CERT_FILE`: what an injected pod
  has) or, without the sidecar, the Hub's CA and a private /etc/hosts.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.parquet
import pytest
import trustme

from bench.harness import (
    HUB_HOSTS,
    PYTHON,
    ROOT,
    HubServer,
    Sidecar,
    clean_env,
    private_mounts,
    start_hub,
)
from bench.hfclient import rows_digest

CLIENT_TIMEOUT = 120  # seconds for one client run
SHORT_EXPIRY = 4  # seconds the short Hub's tokens and URLs are valid
CHUNK = 64 * 1024  # bytes: bench.xet's chunk size
XORB_CHUNKS = 15  # chunks per xorb with XORB_SIZE (15 chunks and their headers fit)
XORB_SIZE = 1024 * 1024  # bytes: small xorbs, so that a few MiB make several
XORB_BYTES = XORB_CHUNKS * CHUNK  # file bytes per full xorb
MODEL = "acme/tiny-model"
DATASET = "acme/tiny-frames"


def _text(lines: int) -> bytes:
    return b"".join(b"%d,frame-%08d,label-%d\n" % (i, i * 7, i % 10) for i in range(lines))


def _parquet(rng: random.Random, first: int, rows: int) -> bytes:
    """A real Parquet file (uncompressed: its pages are as large as their bytes) of
    `rows` frames of 1 KB from id `first`: what `datasets` reads."""
    table = pyarrow.table(
        {
            "id": list(range(first, first + rows)),
            "frame": [rng.randbytes(1000) for _ in range(rows)],
        }
    )
    out = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(table, out, compression="none")
    return bytes(out.getvalue())


def train_rows_digest(repos: Path, repo: str) -> str:
    """What `datasets.load_dataset` of a dataset's `train` split must read: its Parquet
    files' rows in order (`bench.hfclient.rows_digest`)."""
    files = sorted((repos / "datasets" / repo / "data").glob("train-*.parquet"))
    table = pyarrow.concat_tables(pyarrow.parquet.read_table(f) for f in files)
    return rows_digest(table.to_pydict())


def _repositories(rng: random.Random) -> dict[str, dict[str, bytes]]:
    """The files of each repository: a model whose v2 weights share their first three
    xorbs with v1's, an adapter made of two disjoint pieces of the weights' first xorb
    (a reconstruction of two ranges of one xorb), a compressible file (LZ4 chunks), a
    plain LFS file (not in Xet: `*.bin`), plain git files; and a dataset."""
    weights = rng.randbytes(4 * XORB_BYTES + 12_345)
    v2 = weights[: 3 * XORB_BYTES] + rng.randbytes(XORB_BYTES + 777)
    tokenizer = rng.randbytes(300_000)
    frames = _parquet(rng, 0, 700), _parquet(rng, 700, 500)
    # Two disjoint chunk ranges of the weights' first xorb, around a chunk of its own.
    adapter = weights[: 2 * CHUNK] + rng.randbytes(CHUNK) + weights[5 * CHUNK : 7 * CHUNK]
    return {
        f"models/{MODEL}": {
            "config.json": b'{"architectures": ["Tiny"], "hidden_size": 64}\n',
            "README.md": b"# tiny-model\n\nA model for tests.\n",
            "model.safetensors": weights,
            "model-v2.safetensors": v2,
            "vocab.txt": _text(12_000),
            "tokenizer.bin": tokenizer,
            "peft/adapter.safetensors": adapter,
        },
        f"datasets/{DATASET}": {
            "README.md": b"# tiny-frames\n",
            "data/train-00000-of-00002.parquet": frames[0],
            "data/train-00001-of-00002.parquet": frames[1],
        },
    }


@pytest.fixture(scope="session")
def needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: Hub names resolve through a private /etc/hosts")


@pytest.fixture(scope="session")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repositories' directory: `models/<owner>/<name>/...`, `datasets/...`."""
    root = tmp_path_factory.mktemp("repos")
    for repo, files in _repositories(random.Random(49)).items():
        for name, data in files.items():
            path = root / repo / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return root


@pytest.fixture(scope="session")
def hub_hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hosts file mapping every Hub name to loopback."""
    path = tmp_path_factory.mktemp("hosts") / "hosts"
    path.write_text("127.0.0.1 localhost " + " ".join(HUB_HOSTS) + "\n")
    return path


def _start(repos: Path, ca: trustme.CA, tmp: Path, expiry: float, *args: str) -> HubServer:
    args += ("--expiry", str(expiry), "--xorb-size", str(XORB_SIZE), "--no-xet", "*.bin")
    return start_hub(repos, ca, tmp, *args, "--access-log")


@pytest.fixture(scope="session")
def hub(
    needs_root: None, repos: Path, origin_ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HubServer]:
    """The Hub, signing tokens and URLs for an hour."""
    server = _start(repos, origin_ca, tmp_path_factory.mktemp("hub"), 3600)
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def short_hub(
    needs_root: None, repos: Path, origin_ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HubServer]:
    """The Hub, signing tokens and URLs for `SHORT_EXPIRY` seconds."""
    server = _start(repos, origin_ca, tmp_path_factory.mktemp("short-hub"), SHORT_EXPIRY)
    yield server
    server.process.stop()


@pytest.fixture(scope="session")
def multirange_hub(
    needs_root: None, repos: Path, origin_ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HubServer]:
    """The Hub, its v2 reconstructions signing one URL per xorb for all its ranges."""
    server = _start(
        repos, origin_ca, tmp_path_factory.mktemp("multirange-hub"), 3600, "--multirange"
    )
    yield server
    server.process.stop()


def source(repos: Path, repo: str, name: str, repo_type: str = "model") -> bytes:
    return (repos / f"{repo_type}s" / repo / name).read_bytes()


def digests(repos: Path, repo: str, repo_type: str = "model") -> dict[str, str]:
    """SHA-256 of every file of a repository, by path."""
    base = repos / f"{repo_type}s" / repo
    return {
        p.relative_to(base).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(base.rglob("*"))
        if p.is_file()
    }


# -- the clients ------------------------------------------------------------------------

# Runs in the client's process: downloads as asked (argv[1], JSON) and prints the SHA-256
# of every file it got, by path in the repository.


@dataclass
class Run:
    returncode: int
    files: dict[str, str]  # SHA-256 by path
    stderr: str


@dataclass
class Clients:
    """Runs the real client as a new worker would: a fresh `HF_HOME` every time."""

    hub: HubServer
    home: Path
    env: dict[str, str]
    argv: Callable[[list[str]], list[str]]
    runs: int = 0

    def download(
        self,
        repo: str,
        names: list[str] | None = None,
        repo_type: str = "model",
        xet: bool = True,
        fs: bool = False,
        load: bool = False,
        **env: str,
    ) -> Run:
        """`hf_hub_download` of each of `names`, or `snapshot_download` without them, or
        with `fs` each Parquet file read through `HfFileSystem` (as `datasets` does), or
        with `load` the `train` split by `datasets.load_dataset` (`bench.hfclient`)."""
        self.runs += 1
        hf_home = self.home / f"hf-home-{self.runs}"
        full_env = {**self.env, "HF_HOME": str(hf_home), **env}
        if not xet:
            full_env["HF_HUB_DISABLE_XET"] = "1"
        ask = json.dumps(
            {"repo": repo, "names": names, "type": repo_type, "fs": fs, "load": load}
        )
        done = subprocess.run(
            self.argv([PYTHON, "-m", "bench.hfclient", ask]),
            env=full_env,
            capture_output=True,
            timeout=CLIENT_TIMEOUT,
            cwd=ROOT,
        )
        shutil.rmtree(hf_home, ignore_errors=True)  # the next run is a new worker
        stderr = done.stderr.decode(errors="replace")
        files = (
            json.loads(done.stdout.decode().strip().splitlines()[-1])
            if done.returncode == 0
            else {}
        )
        return Run(done.returncode, files, stderr)


def _client_env(hub: HubServer, **extra: str) -> dict[str, str]:
    return clean_env(
        HF_ENDPOINT=hub.endpoint,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        **extra,
    )


def direct_clients(hub: HubServer, hosts: Path, home: Path) -> Clients:
    """The clients straight to the Hub: its CA trusted, its names in a private /etc/hosts."""
    env = _client_env(hub, SSL_CERT_FILE=str(hub.ca_pem))
    return Clients(hub, home, env, lambda argv: private_mounts({"/etc/hosts": hosts}, argv))


@pytest.fixture
def direct(hub: HubServer, hub_hosts: Path, tmp_path: Path) -> Clients:
    return direct_clients(hub, hub_hosts, tmp_path)


def through(sidecar: Sidecar, hub: HubServer, home: Path) -> Clients:
    """The clients of an injected pod (`proxy-env` capture): the sidecar as proxy, its
    trust bundle as the only CA file, nothing of this machine."""
    proxy = sidecar.proxy
    env = _client_env(
        hub,
        http_proxy=proxy,
        https_proxy=proxy,
        HTTP_PROXY=proxy,
        HTTPS_PROXY=proxy,
        no_proxy="localhost,127.0.0.1",
        SSL_CERT_FILE=str(sidecar.bundle),
        REQUESTS_CA_BUNDLE=str(sidecar.bundle),
    )
    return Clients(hub, home, env, lambda argv: argv)


@pytest.fixture
def start_sidecar(
    needs_root: None, hub_hosts: Path, tmp_path: Path
) -> Iterator[Callable[..., Sidecar]]:
    """Start a sidecar with its default intercept list, trusting the Hub's CA:
    `start_sidecar(hub)`, `start_sidecar(hub, directory=old.directory)` (a restart)."""
    started: list[Sidecar] = []

    def start(hub: HubServer, *args: str, directory: Path | None = None) -> Sidecar:
        base = directory or tmp_path / f"sidecar{len(started)}"
        base.mkdir(exist_ok=True)
        sidecar = Sidecar(base, hub_hosts, ["--upstream-ca", str(hub.ca_pem), *args])
        started.append(sidecar)
        sidecar.start()
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop()


# -- what reached the Hub ---------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """Requests the Hub saw between two readings of its counts."""

    requests: dict[str, int]  # by kind
    statuses: dict[str, int]  # by "<kind> <status>"
    xorbs: dict[str, int]  # by "<xorb> <first>-<last>"

    def __getitem__(self, kind: str) -> int:
        return self.requests.get(kind, 0)

    def status(self, kind: str, status: int) -> int:
        return self.statuses.get(f"{kind} {status}", 0)


class Counter:
    """`with Counter(hub) as seen:` ... `seen.value` is what the Hub saw meanwhile."""

    def __init__(self, hub: HubServer) -> None:
        self.hub = hub
        self.value = Seen({}, {}, {})

    def __enter__(self) -> Counter:
        self._before = self.hub.requests()
        return self

    def __exit__(self, *_: object) -> None:
        after = self.hub.requests()

        def delta(name: str) -> dict[str, int]:
            changed = {k: v - self._before[name].get(k, 0) for k, v in after[name].items()}
            return {k: v for k, v in changed.items() if v}

        self.value = Seen(delta("requests"), delta("statuses"), delta("xorbs"))


def wait_past(seconds: float) -> None:
    """Let `seconds` of the Hub's expiry pass: the one wait these tests make on purpose."""
    time.sleep(seconds)


# -- talking to the Hub by hand ---------------------------------------------------------


def _context(hub: HubServer) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(hub.ca_pem))


def get(
    hub: HubServer, url: str, method: str = "GET", **headers: str
) -> tuple[int, bytes, dict[str, str]]:
    """A request to `url` (on a Hub host), sent to the Hub's port on loopback with the
    URL's host in `Host` (the certificate names 127.0.0.1 too)."""
    parts = urllib.parse.urlsplit(url)
    target = f"https://127.0.0.1:{hub.port}{parts.path}" + (
        f"?{parts.query}" if parts.query else ""
    )
    request = urllib.request.Request(
        target, method=method, headers={"Host": parts.netloc, **headers}
    )
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        urllib.request.HTTPSHandler(context=_context(hub)),
        _NoRedirects(),
    )
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def resolve_headers(hub: HubServer, repo: str, name: str) -> dict[str, str]:
    status, _, headers = get(hub, f"{hub.endpoint}/{repo}/resolve/main/{name}", method="HEAD")
    assert status == 302
    return headers


def read_token(hub: HubServer, repo: str) -> dict[str, Any]:
    status, body, _ = get(hub, f"{hub.endpoint}/api/models/{repo}/xet-read-token/main")
    assert status == 200
    return json.loads(body)


def cas_get(hub: HubServer, path: str, token: str | None, **headers: str) -> tuple[int, bytes]:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    status, body, _ = get(hub, f"https://{HUB_HOSTS[1]}:{hub.port}{path}", **headers)
    return status, body


def reconstruction(hub: HubServer, repo: str, name: str) -> dict[str, Any]:
    file_hash = resolve_headers(hub, repo, name)["X-Xet-Hash"]
    token = read_token(hub, repo)["accessToken"]
    status, body = cas_get(hub, f"/v2/reconstructions/{file_hash}", token)
    assert status == 200
    return json.loads(body)


def xorb_ranges(hub: HubServer, repo: str, name: str) -> set[str]:
    """The xorb ranges a download of the file fetches, as the Hub counts them."""
    answer = reconstruction(hub, repo, name)
    return {
        f"{xorb} {r['bytes']['start']}-{r['bytes']['end']}"
        for xorb, fetches in answer["xorbs"].items()
        for fetch in fetches
        for r in fetch["ranges"]
    }


def first_fetch(hub: HubServer, repo: str, name: str) -> dict[str, str]:
    answer = reconstruction(hub, repo, name)
    fetch = answer["xorbs"][answer["terms"][0]["hash"]][0]
    [descriptor] = fetch["ranges"]
    signed = f"bytes={descriptor['bytes']['start']}-{descriptor['bytes']['end']}"
    assert f"X-Xet-Signed-Range={urllib.parse.quote(signed, safe='')}" in fetch["url"]
    return {"url": fetch["url"], "signed": signed}
