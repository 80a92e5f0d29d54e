"""A data loader's download pattern, as a program: N worker processes read a file set.

    python -m bench.loader_client --manifest FILE --workers N
        --shape keep-alive|per-file|absolute-form --cafile PEM [--proxy http://127.0.0.1:3128]
        [--header 'Name: value']...

The manifest holds one `URL SIZE SHA256` line per file. Like a PyTorch DataLoader,
the epoch is sharded over the workers (worker i reads files i, i+N, ...); every
worker starts behind one barrier. `keep-alive` workers each keep one connection
(`http.client`, what requests and urllib3 keep underneath; through the proxy, one
CONNECT tunnel); `per-file` workers open a new connection for every file with
`urllib.request`, which sends `Connection: close`; `absolute-form` workers keep one
plain HTTP connection to the proxy and ask it for each URL (`GET https://...`), as a
sidecar asks its parent cache. An `http://` URL is asked of the proxy that way by every
shape, as clients ask a proxy for one; without a proxy, over plain HTTP. Each `--header`
goes with every request (for example `Cache-Control: no-store`, which a cache passes
through without storing). Every body is
checked against its size, and every 16th against its SHA-256, so a wrong path cannot
look fast.

Prints one JSON object: the epoch's wall time (from the barrier to the last worker's
last byte) and every file's latency in seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import multiprocessing
import ssl
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier

# Only some bodies are hashed: hashing every byte would cost the client as much as TLS.
HASH_EVERY = 16


@dataclass(frozen=True)
class Entry:
    url: str
    size: int
    sha256: str


def _read_manifest(path: str) -> list[Entry]:
    with open(path) as manifest:
        return [Entry(u, int(s), h) for u, s, h in (line.split() for line in manifest)]


def _check(entry: Entry, position: int, body: bytes) -> None:
    if len(body) != entry.size:
        raise SystemExit(f"{entry.url}: {len(body)} bytes, expected {entry.size}")
    if position % HASH_EVERY == 0 and hashlib.sha256(body).hexdigest() != entry.sha256:
        raise SystemExit(f"{entry.url}: wrong bytes")


def _keep_alive(
    proxy: str | None, cafile: str, absolute: bool, headers: dict[str, str]
) -> Callable[[str], bytes]:
    """One kept-alive connection (through the proxy: one CONNECT tunnel, or with
    `absolute` plain HTTP to the proxy itself), the one a `requests.Session` keeps,
    without the work requests itself adds per request."""
    context = ssl.create_default_context(cafile=cafile)
    connection: http.client.HTTPConnection | None = None

    def get(url: str) -> bytes:
        nonlocal connection
        parts = urllib.parse.urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        # A proxy is asked for an http URL itself, as every client asks it.
        to_proxy = bool(proxy) and (absolute or parts.scheme == "http")
        if connection is None:
            if proxy and to_proxy:
                address = urllib.parse.urlsplit(proxy)
                connection = http.client.HTTPConnection(
                    address.hostname or "", address.port, timeout=60
                )
            elif proxy:
                address = urllib.parse.urlsplit(proxy)
                connection = http.client.HTTPSConnection(
                    address.hostname or "", address.port, context=context, timeout=60
                )
                connection.set_tunnel(parts.hostname or "", parts.port)
            elif parts.scheme == "http":
                host = parts.hostname or ""
                connection = http.client.HTTPConnection(host, parts.port, timeout=60)
            else:
                connection = http.client.HTTPSConnection(
                    parts.hostname or "", parts.port, context=context, timeout=60
                )
        connection.request("GET", url if to_proxy else target, headers=headers)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"{url}: HTTP {response.status}")
        return body

    return get


def _per_file(proxy: str | None, cafile: str, headers: dict[str, str]) -> Callable[[str], bytes]:
    handlers: list[urllib.request.BaseHandler] = [
        urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=cafile)),
        urllib.request.ProxyHandler({"https": proxy, "http": proxy} if proxy else {}),
    ]
    opener = urllib.request.build_opener(*handlers)

    def get(url: str) -> bytes:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=60) as response:
            return bytes(response.read())

    return get


def _worker(
    entries: list[Entry],
    shape: str,
    proxy: str | None,
    cafile: str,
    headers: dict[str, str],
    barrier: Barrier,
    results: Queue[tuple[float, list[float]]],
) -> None:
    if shape == "per-file":
        get = _per_file(proxy, cafile, headers)
    else:
        get = _keep_alive(proxy, cafile, shape == "absolute-form", headers)
    latencies = []
    barrier.wait()
    for position, entry in enumerate(entries):
        started = time.perf_counter()
        body = get(entry.url)
        latencies.append(time.perf_counter() - started)
        _check(entry, position, body)
    results.put((time.perf_counter(), latencies))


def _header(line: str) -> tuple[str, str]:
    name, colon, value = line.partition(":")
    if not colon or not name.strip():
        raise argparse.ArgumentTypeError(f"not a 'Name: value' header: {line!r}")
    return name.strip(), value.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loader_client")
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument(
        "--shape", choices=("keep-alive", "per-file", "absolute-form"), required=True
    )
    parser.add_argument("--cafile", required=True)
    parser.add_argument("--proxy")
    parser.add_argument("--header", action="append", default=[], type=_header)
    args = parser.parse_args(argv)
    entries = _read_manifest(args.manifest)
    context = multiprocessing.get_context("fork")
    # One more party: this process, which starts the clock when everyone is there.
    barrier = context.Barrier(args.workers + 1)
    results: Queue[tuple[float, list[float]]] = context.Queue()
    workers = [
        context.Process(
            target=_worker,
            args=(shard, args.shape, args.proxy, args.cafile, dict(args.header), barrier, results),
        )
        for shard in (entries[i :: args.workers] for i in range(args.workers))
    ]
    for worker in workers:
        worker.start()
    barrier.wait(timeout=60)
    started = time.perf_counter()
    finished = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise SystemExit(f"a loader worker failed (exit status {worker.exitcode})")
    json.dump(
        {
            "seconds": max(end for end, _ in finished) - started,
            "latencies": [latency for _, latencies in finished for latency in latencies],
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
