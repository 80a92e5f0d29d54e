"""`make demo`: a far dataset host, the sidecar, and wget downloading one file twice.

The origin is a local HTTPS server throttled to the per-connection rate Nezha measured
to a far host (3.49 MB/s), serving a file the size of CIFAR-100 (169 MB). Unmodified
GNU wget fetches it twice through the sidecar, trusting the pod's CA bundle exactly as
an injected pod does (mounted over the system bundle): the first download fills the
burst buffer (over parallel ranged connections, since the origin is slow), the second
is served from it. Cold and warm throughput and the speedups are printed.

Run as root (as a pod's network is emulated with a private /etc/hosts and bind
mounts); without root it says so and stops.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trustme

from bench.harness import Sidecar, clean_env, start_origin

NEZHA_FAR_HOST_RATE = 3.49e6  # bytes/s, per connection
HOST = "datasets.demo.test"


def wget_through(sidecar: Sidecar, url: str, out: Path) -> float:
    """Download with wget via the sidecar; return the seconds it took."""
    argv = [
        "unshare", "-m", "sh", "-c",
        'mount --bind "$0" /etc/ssl/certs/ca-certificates.crt && exec "$@"',
        str(sidecar.bundle), "wget", "-q", "--no-config", "-O", str(out), url,
    ]  # fmt: skip
    env = clean_env(https_proxy=sidecar.proxy, http_proxy=sidecar.proxy)
    started = time.monotonic()
    subprocess.run(argv, env=env, check=True, timeout=900)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=169, help="file size in MB (default 169)")
    parser.add_argument(
        "--rate", type=float, default=NEZHA_FAR_HOST_RATE, help="origin throttle, bytes/s"
    )
    args = parser.parse_args()
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("wget"):
        sys.exit("make demo needs root, unshare and wget (it emulates a pod's mounts and hosts)")

    with tempfile.TemporaryDirectory(prefix="burstbuffer-demo-") as tmp:
        work = Path(tmp)
        (work / "dataset").mkdir()
        dataset = work / "dataset" / "train-images.bin"
        size = args.size_mb * 1_000_000
        dataset.write_bytes(os.urandom(size))
        hosts = work / "hosts"
        hosts.write_text(f"127.0.0.1 localhost {HOST}\n")

        ca = trustme.CA()
        origin = start_origin(work / "dataset", ca, [HOST], work, rate=args.rate)
        (work / "pod").mkdir()
        sidecar = Sidecar(
            work / "pod", hosts, ["--intercept", HOST, "--upstream-ca", str(origin.ca_pem)]
        )
        try:
            sidecar.start()
            url = f"https://{HOST}:{origin.port}/files/{dataset.name}"
            print(f"origin: {url} ({size / 1e6:.0f} MB, throttled to {args.rate / 1e6:.2f} MB/s)")
            print(f"sidecar: proxy {sidecar.proxy}, buffer {sidecar.buffer_dir}")
            expected = hashlib.sha256(dataset.read_bytes()).hexdigest()
            results = []
            for label in ("cold (miss: origin -> buffer -> wget)", "warm (hit: buffer -> wget)"):
                out = work / "download"
                seconds = wget_through(sidecar, url, out)
                ok = hashlib.sha256(out.read_bytes()).hexdigest() == expected
                out.unlink()
                results.append(seconds)
                print(
                    f"  wget {label}: {seconds:7.2f} s  {size / seconds / 1e6:9.1f} MB/s"
                    f"  {'byte-identical' if ok else 'CORRUPT'}"
                )
                if not ok:
                    sys.exit("download differs from the origin's file")
            stats = sidecar.stats()
            warm = size / results[1]
            print(f"speedup warm vs cold: {results[0] / results[1]:.0f}x")
            print(
                f"speedup warm vs wget straight from the origin ({args.rate / 1e6:.2f} MB/s): "
                f"{warm / args.rate:.0f}x"
            )
            print(
                f"sidecar /stats: hits={stats['hits']} misses={stats['misses']} "
                f"entries={stats['entries']} buffer_bytes={stats['buffer_bytes']}"
            )
        finally:
            sidecar.stop()
            origin.process.stop()


if __name__ == "__main__":
    main()
