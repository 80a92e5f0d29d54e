"""The data loader's epochs and a large hit through each way into the sidecar, against nginx.

The file set of `bench.bench_loader`, stored once and then read, every file a hit, in
its three client shapes, and one large object read by curl; then first epochs, every
file a miss (a fifth of the files, each epoch's URLs new to the sidecar: a query the
origin ignores), each against nginx read directly and, as a ratio to that, against the
forward HTTPS path's own; through each entrance:

- forward HTTPS: a CONNECT to the host, TLS inside (`https://` URLs through the proxy
  variables), against nginx's HTTPS;
- forward plain HTTP: `GET http://host/path` asked of the proxy itself (`http://`
  dataset hosts through the proxy variables), against nginx's plain HTTP;
- hostAliases TLS and plain HTTP: the client, with no proxy variables, resolves the
  host to 127.0.0.1 in its /etc/hosts and connects to the sidecar's :443 (routed by the
  ClientHello's SNI) or :80 (by the Host);
- transparent TLS and plain HTTP: the client connects to the origin's own address, and
  the injector's iptables rule redirects the connection to the sidecar's transparent
  listener (routed by its original destination, then the SNI or the Host).

Each capture runs in a network namespace of its own, as a pod's: nginx is the origin on
ORIGIN_ADDRESS:443 and :80, a DNS server there names the host (the hostAliases sidecar
resolves origins through DNS only), the sidecar runs as the image's USER with the pod's
sysctl (hostAliases: ports 80 and 443 without a capability) or the injector's own
iptables rule (transparent: every port 80 and 443 but the sidecar's UID). The reference
is the same nginx on ports of its own, read directly in the same run, in turn; each
server's CPU per 1,000 files is its whole process tree's.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bench import clients
from bench.bench_loader import (
    LARGEST,
    SMALLEST,
    File,
    KiB,
    Shape,
    epoch,
    file_sizes,
    make_files,
    write_manifest,
)
from bench.clients import Route
from bench.dnsserver import DnsServer
from bench.harness import free_port
from bench.lab import HOST, Lab, Profile, expect_stats, in_turn, mb_per_s
from bench.netns import in_netns, netns
from bench.report import Requirement, Result, Row, Sample, ratio_at_least, target_ratio
from injector.aliases import LOWEST_PORT, UNPRIVILEGED_PORT_START
from injector.redirect import iptables_rule

logger = logging.getLogger(__name__)

NAME = "entrances"
# The targets of a warm epoch through every entrance, of nginx's files/s.
KEPT_ALIVE, PER_FILE = 0.95, 0.9
# The large hit's target, of nginx's MB/s.
LARGE = 1.0
# A first epoch through an entrance, read against nginx directly, of the forward HTTPS
# path's own ratio.
FIRST_EPOCH = 0.95
# A first epoch reads this share of the files (each epoch's URLs new to the sidecar):
# every one stays stored, in memory.
FIRST_EPOCH_SHARE = 0.2
# Inside each capture's network namespace: the origin's address (what DNS answers for
# HOST) and the DNS server's.
ORIGIN_ADDRESS = "127.0.0.2"
DNS_ADDRESS = "127.0.0.53"
# The sidecar's UID: the image's USER, which the injector's iptables rule leaves alone.
SIDECAR_UID = 65532


@dataclass(frozen=True)
class Entrance:
    name: str
    scheme: str  # "https" (against nginx's HTTPS) or "http" (against its plain HTTP)
    proxied: bool  # through the proxy variables; else captured, with no proxy set


@dataclass(frozen=True)
class Capture:
    """One capture mode's run: the sidecar's `--capture`, the entrances measured."""

    mode: str
    entrances: tuple[Entrance, ...]


CAPTURES = (
    Capture(
        "hostAliases",
        (
            Entrance("forward HTTPS", "https", proxied=True),
            Entrance("forward plain HTTP", "http", proxied=True),
            Entrance("hostAliases TLS", "https", proxied=False),
            Entrance("hostAliases plain HTTP", "http", proxied=False),
        ),
    ),
    Capture(
        "transparent",
        (
            Entrance("transparent TLS", "https", proxied=False),
            Entrance("transparent plain HTTP", "http", proxied=False),
        ),
    ),
)


def shapes(profile: Profile) -> list[Shape]:
    workers = profile.loader_workers
    return [
        Shape("1 worker, keep-alive", 1, "keep-alive", target_ratio(KEPT_ALIVE)),
        Shape(f"{workers} workers, keep-alive", workers, "keep-alive", target_ratio(KEPT_ALIVE)),
        Shape(
            f"{workers} workers, new connection per file",
            workers,
            "per-file",
            target_ratio(PER_FILE),
        ),
    ]


@dataclass(frozen=True)
class Side:
    """One side of a comparison: who serves, how it is reached, its files' URLs."""

    name: str  # "nginx" or "sidecar"
    route: Route
    pid: int  # the server's, whose process tree's CPU is counted
    manifest: Path  # the loader's files
    url: Callable[[str, str], str]  # (name, host) → a file's URL


# What each side measured: (entrance, what, side) → one figure per run.
Measured = dict[tuple[str, str, str], list[float]]


def run(profile: Profile, lab: Lab) -> Result:
    count = profile.loader_files
    sizes = file_sizes(count)
    large = profile.epoch_large_bytes
    result = Result(
        NAME,
        f"Entrances: the data loader's epochs over {count} files of "
        f"{SMALLEST // KiB} KiB–{LARGEST // KiB} KiB (median "
        f"{statistics.median(sizes) / KiB:.0f} KiB), a {large // 2**20} MiB hit and first "
        "epochs, through each way in",
    )
    files = make_files(lab, sizes)
    source = lab.make_file("large.bin", large)
    large_file = File(source.name, large, "")
    measured: Measured = {}
    for capture in CAPTURES:
        sysctls = {UNPRIVILEGED_PORT_START: str(LOWEST_PORT)}
        with netns("bbbench", sysctls if capture.mode == "hostAliases" else None) as name:
            measured |= in_netns(name, partial(_measure, capture, profile, lab, files, large_file))

    cores = len(os.sched_getaffinity(0))
    for capture in CAPTURES:
        for entrance in capture.entrances:
            reference = _reference(entrance, cores)
            for shape in shapes(profile):
                for label, unit, figure, required in (
                    ("throughput", "files/s", "files/s", shape.required),
                    ("CPU per 1,000 files", "s", "cpu", None),
                ):
                    result.rows.append(
                        _row(measured, entrance, shape.name, f"{shape.name}, {label}", unit,
                             figure, reference, required)
                    )  # fmt: skip
            result.rows.append(
                _row(measured, entrance, "large", f"{large // 2**20} MiB hit", "MB/s", "MB/s",
                     reference, ratio_at_least(0.8, target=LARGE))
            )  # fmt: skip
    for capture in CAPTURES:
        for entrance in capture.entrances:
            result.rows += _first_epoch_rows(measured, entrance, profile, cores)
    result.notes.append(
        f"medians of {profile.runs} epochs (min–max); warm: every file a hit (checked in"
        " /stats, each one answered by the core); first epochs: every file a miss (checked);"
        " clients: bench.loader_client, as in the loader"
        " benchmark, and curl for the large hit; an http URL is asked of the proxy in"
        " absolute form, as clients ask a proxy for one; CPU of each server's whole"
        " process tree"
    )
    return result


def _first_epoch_rows(
    measured: Measured, entrance: Entrance, profile: Profile, cores: int
) -> list[Row]:
    """Each shape's first epoch through `entrance`: its files/s against nginx read
    directly, and that ratio against the forward HTTPS path's own."""
    rows = []
    forward = CAPTURES[0].entrances[0]
    for shape in shapes(profile):
        what = f"first epoch, {shape.name}"
        rows.append(
            _row(measured, entrance, what, f"{what}, throughput", "files/s", "files/s",
                 f"{_reference(entrance, cores)}, read directly", None)
        )  # fmt: skip
        if entrance != forward:
            rows.append(
                Row(
                    f"{entrance.name}, {what}, of reading nginx directly",
                    "×",
                    Sample.of(_ratios(measured, entrance, what)),
                    Sample.of(_ratios(measured, forward, what)),
                    f"{forward.name}'s",
                    target_ratio(FIRST_EPOCH),
                )
            )
    return rows


def _reference(entrance: Entrance, cores: int) -> str:
    """The nginx an entrance is measured against: its HTTPS, or its plain HTTP."""
    return f"nginx, {cores} workers, " + ("HTTPS" if entrance.scheme == "https" else "plain HTTP")


def _ratios(measured: Measured, entrance: Entrance, what: str) -> list[float]:
    """Each run's files/s through `entrance` over nginx's, read directly."""
    ours = measured[entrance.name, what, "sidecar files/s"]
    theirs = measured[entrance.name, what, "nginx files/s"]
    return [a / b for a, b in zip(ours, theirs, strict=True)]


def _row(
    measured: Measured,
    entrance: Entrance,
    what: str,
    label: str,
    unit: str,
    figure: str,
    reference: str,
    required: Requirement | None,
) -> Row:
    return Row(
        f"{entrance.name}, {label}",
        unit,
        Sample.of(measured[entrance.name, what, "sidecar " + figure]),
        Sample.of(measured[entrance.name, what, "nginx " + figure]),
        reference,
        required,
    )


def _measure(
    capture: Capture, profile: Profile, lab: Lab, files: list[File], large: File
) -> Measured:
    """Every entrance of `capture` against nginx, inside the capture's network namespace."""
    count = len(files)
    cores = len(os.sched_getaffinity(0))
    dns = DnsServer(_udp_socket(DNS_ADDRESS, 53), {HOST: ORIGIN_ADDRESS})
    try:
        nginx = lab.nginx(workers=cores, origin_address=ORIGIN_ADDRESS)
        origin_hosts = lab.dir / f"hosts-{capture.mode}"
        origin_hosts.write_text(f"127.0.0.1 localhost\n{ORIGIN_ADDRESS} {HOST}\n")
        resolv_conf = lab.dir / "resolv.conf"
        resolv_conf.write_text(f"nameserver {DNS_ADDRESS}\n")
        # With hostAliases the pod's hosts file sends the host to the sidecar; with the
        # transparent capture it names the origin, and the rule does the rest.
        pod_hosts = lab.hosts if capture.mode == "hostAliases" else origin_hosts
        flags = ["--capture", capture.mode]
        if capture.mode == "transparent":
            port = free_port()
            flags += ["--transparent-port", str(port)]
            subprocess.run(iptables_rule(port, SIDECAR_UID), check=True, capture_output=True,
                           timeout=10)  # fmt: skip
        # First epochs read a share of the files, each epoch with URLs of its own (a
        # query the origin ignores).
        first_files = files[: max(1, int(count * FIRST_EPOCH_SHARE))]
        first_epochs = profile.runs * len(capture.entrances) * len(shapes(profile))
        first_bytes = first_epochs * sum(f.size for f in first_files)
        buffer = 3 * (sum(f.size for f in files) + large.size) + first_bytes
        sidecar = lab.sidecar(
            nginx.ca_pem, *flags, "--buffer-size", str(buffer),
            hosts=pod_hosts, resolv_conf=resolv_conf, user=SIDECAR_UID,
        )  # fmt: skip
        direct, forward = lab.direct(nginx), lab.through(sidecar)
        captured = Route(sidecar.bundle, pod_hosts)
        routes = {e.name: forward if e.proxied else captured for e in capture.entrances}
        references: dict[str, Callable[[str, str], str]] = {
            "https": nginx.url, "http": nginx.plain_url,
        }  # fmt: skip
        reference_manifests = {
            scheme: write_manifest(lab.dir / f"nginx-{scheme}.txt", files, url)
            for scheme, url in references.items()
        }
        manifests = {
            scheme: write_manifest(lab.dir / f"origin-{scheme}.txt", files, _origin_url(scheme))
            for scheme in references
        }
        # Every URL is stored once, through the capture's first entrance of its scheme.
        fill = Shape("fill", profile.loader_workers, "keep-alive", None)
        first = {e.scheme: e for e in reversed(capture.entrances)}
        for scheme, entrance in first.items():
            epoch(routes[entrance.name], manifests[scheme], fill, sidecar.pid, count)
            url = _origin_url(scheme)(large.name, HOST)
            clients.curl(routes[entrance.name], url, large.size)
        stored = (count + 1) * len(first)
        sidecar.wait_for_entries(stored)
        expect_stats(sidecar, misses=stored, hits=0)

        measured: Measured = {}
        for run_index in range(profile.runs):
            for entrance in capture.entrances:
                sides = [
                    Side("nginx", direct, nginx.process.popen.pid,
                         reference_manifests[entrance.scheme], references[entrance.scheme]),
                    Side("sidecar", routes[entrance.name], sidecar.pid,
                         manifests[entrance.scheme], _origin_url(entrance.scheme)),
                ]  # fmt: skip
                for shape in shapes(profile):
                    logger.info("%s: run %d/%d, %s, %s", NAME, run_index + 1, profile.runs,
                                entrance.name, shape.name)  # fmt: skip
                    for side in in_turn(run_index, sides):
                        found = epoch(side.route, side.manifest, shape, side.pid, count)
                        for figure, value in (("files/s", found.files_per_s),
                                              ("cpu", found.cpu_per_1000)):  # fmt: skip
                            key = (entrance.name, shape.name, f"{side.name} {figure}")
                            measured.setdefault(key, []).append(value)
                for side in in_turn(run_index, sides):
                    seconds = clients.curl(side.route, side.url(large.name, HOST), large.size)
                    key = (entrance.name, "large", f"{side.name} MB/s")
                    measured.setdefault(key, []).append(mb_per_s(large.size, seconds))
        per_run = len(capture.entrances) * (count * len(shapes(profile)) + 1)
        hits = profile.runs * per_run
        expect_stats(sidecar, misses=stored, hits=hits, hits_answered_by_core=hits)

        nginx_first = {
            scheme: write_manifest(lab.dir / f"nginx-first-{scheme}.txt", first_files, url)
            for scheme, url in references.items()
        }
        for run_index in range(profile.runs):
            for number, entrance in enumerate(capture.entrances):
                for shape_number, shape in enumerate(shapes(profile)):
                    logger.info("%s: run %d/%d, %s, first epoch, %s", NAME, run_index + 1,
                                profile.runs, entrance.name, shape.name)  # fmt: skip
                    query = f"first={run_index}.{number}.{shape_number}"
                    first_url = _origin_url(entrance.scheme, query)
                    sides = [
                        Side("nginx", direct, nginx.process.popen.pid,
                             nginx_first[entrance.scheme], references[entrance.scheme]),
                        Side("sidecar", routes[entrance.name], sidecar.pid,
                             write_manifest(lab.dir / "first.txt", first_files, first_url),
                             first_url),
                    ]  # fmt: skip
                    for side in in_turn(run_index, sides):
                        found = epoch(side.route, side.manifest, shape, side.pid, len(first_files))
                        key = (entrance.name, f"first epoch, {shape.name}", f"{side.name} files/s")
                        measured.setdefault(key, []).append(found.files_per_s)
        misses = stored + first_epochs * len(first_files)
        expect_stats(sidecar, misses=misses, hits=hits)
        return measured
    finally:
        dns.close()


def _origin_url(scheme: str, query: str = "") -> Callable[[str, str], str]:
    """A file's URL at the origin's own port, as a dataset host publishes it."""
    suffix = f"?{query}" if query else ""
    return lambda name, host: f"{scheme}://{host}/files/{name}{suffix}"


def _udp_socket(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, port))
    return sock
