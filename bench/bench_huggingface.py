"""Hugging Face: `snapshot_download` of a Xet repository from a Hub of our own.

The real clients (`huggingface_hub` with `hf_xet`, unmodified) download a repository of
HUB_SHARDS weight files of random bytes and a config file from `bench.hub`: the Hub
answers the API and resolve calls and hands out tokens, its CAS the reconstructions,
and its CDN the xorbs' signed ranges, refusing any other request as the Hub's does.
Three ways, in turn, each run with an empty client cache (`HF_HOME`), as a new worker or
container has it:

- direct: the client reads the Hub and its CDN itself (the reference);
- cold: through a new sidecar with an empty buffer (`proxy-env`, as an injected pod);
- warm: through the same sidecar again, which by then stores every signed range: the
  CDN's counts prove that no xorb request reached it (the tokens and reconstructions
  still pass: they expire, and are never stored).

Figures: MB/s of the whole client process (start to files on disk, hashes checked
against the sources), and the sidecar's CPU seconds per GiB of the repository (its
whole process tree). Neither the Hub's CPU nor the client's is counted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import time
from pathlib import Path

from bench.harness import PYTHON, HubServer, Sidecar, clean_env, cpu_seconds, private_mounts
from bench.hfclient import sha256
from bench.lab import Lab, Profile, WrongPath, in_turn, mb_per_s
from bench.report import Result, Row, Sample

logger = logging.getLogger(__name__)

NAME = "huggingface"
REPO = "bench/weights"
HUB_SHARDS = 4
CLIENT_TIMEOUT = 600  # seconds for one download of the repository
GiB = 2**30


def run(profile: Profile, lab: Lab) -> Result:
    size = profile.hub_bytes
    title = f"Hugging Face: snapshot_download of a {size // 2**20} MiB Xet repository"
    result = Result(NAME, title)
    repositories = lab.scratch("repositories")
    model = repositories / "models" / REPO
    sources = {"config.json": _write(model / "config.json", b'{"model_type": "bench"}\n')}
    for shard in range(HUB_SHARDS):
        name = f"model-{shard + 1:05d}-of-{HUB_SHARDS:05d}.safetensors"
        sources[name] = sha256(lab.make_file(name, size // HUB_SHARDS, model))
    hub = lab.hub(repositories)
    env = clean_env(
        HF_ENDPOINT=hub.endpoint, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1"
    )
    direct = {**env, "SSL_CERT_FILE": str(lab.route(hub.ca_pem).bundle)}

    speeds: dict[str, list[float]] = {"direct": [], "cold": [], "warm": []}
    cpu: dict[str, list[float]] = {"cold": [], "warm": []}
    for run_index in range(profile.runs):
        logger.info("%s: run %d/%d", NAME, run_index + 1, profile.runs)
        for side in in_turn(run_index, ["direct", "sidecar"]):
            if side == "direct":
                seconds = _download(lab, direct, sources)
                speeds["direct"].append(mb_per_s(size, seconds))
                continue
            sidecar = lab.sidecar(
                hub.ca_pem, "--intercept", "*.hf.co", "--buffer-size", str(2 * size)
            )
            pod = {**env, **_proxied(sidecar)}
            for temperature in ("cold", "warm"):
                xorbs_before = _xorb_requests(hub)
                started = cpu_seconds(sidecar.pid)
                seconds = _download(lab, pod, sources)
                cpu[temperature].append((cpu_seconds(sidecar.pid) - started) * GiB / size)
                speeds[temperature].append(mb_per_s(size, seconds))
                if temperature == "warm" and _xorb_requests(hub) != xorbs_before:
                    raise WrongPath("a warm download sent xorb requests to the CDN")
            sidecar.stop()

    for temperature in ("cold", "warm"):
        result.rows.append(
            Row(
                f"snapshot_download through the sidecar, {temperature}",
                "MB/s",
                Sample.of(speeds[temperature]),
                Sample.of(speeds["direct"]),
                "the Hub and its CDN read directly",
            )
        )
        result.rows.append(
            Row(f"sidecar CPU per GiB, {temperature}", "s", Sample.of(cpu[temperature]))
        )
    result.notes.append(
        f"medians of {profile.runs} runs (min–max); {HUB_SHARDS} files of random bytes in"
        f" xorbs of up to 64 MiB; a new HF_HOME for every download; the warm downloads sent"
        f" no request to the CDN (its counts, read after each)"
    )
    return result


def _write(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _proxied(sidecar: Sidecar) -> dict[str, str]:
    """What an injected pod's containers are given: the proxy and the pod's bundle."""
    proxy = sidecar.proxy
    return {"HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "SSL_CERT_FILE": str(sidecar.bundle)}


def _xorb_requests(hub: HubServer) -> int:
    return int(hub.requests().get("xorb", 0))


def _download(lab: Lab, env: dict[str, str], sources: dict[str, str]) -> float:
    """Seconds `snapshot_download` of the repository takes with `env` and an empty
    HF_HOME (deleted after), its files checked against `sources`."""
    home = lab.scratch("hf-home")
    argv = [PYTHON, "-m", "bench.hfclient", json.dumps({"repo": REPO})]
    started = time.perf_counter()
    done = subprocess.run(
        private_mounts({"/etc/hosts": lab.hosts}, argv),
        env={**env, "HF_HOME": str(home)},
        capture_output=True,
        timeout=CLIENT_TIMEOUT,
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    seconds = time.perf_counter() - started
    shutil.rmtree(home, ignore_errors=True)
    if done.returncode != 0:
        raise WrongPath(f"snapshot_download failed: {done.stderr.decode(errors='replace')}")
    files = json.loads(done.stdout.decode().strip().splitlines()[-1])
    if files != sources:
        raise WrongPath(f"snapshot_download got other files or bytes: {sorted(files)}")
    return seconds
