"""The sidecar's typed settings, their parsers, and its command line.

This module is the one place where the sidecar's flag names live: the sidecar
parses them here, and the injector builds the injected container's arguments
with `command_line()` from here, so the two can never disagree.

Every flag can also be given as an environment variable `BURSTBUFFER_<FLAG>`
(`--buffer-size` -> `BURSTBUFFER_BUFFER_SIZE`); a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Eviction = Literal["none", "lru"]
EVICTION_POLICIES: tuple[Eviction, ...] = ("none", "lru")
Capture = Literal["proxy-env", "hostAliases", "transparent"]
CAPTURE_MODES: tuple[Capture, ...] = ("proxy-env", "hostAliases", "transparent")

ENV_PREFIX = "BURSTBUFFER_"

# Well-known dataset hosts, intercepted and cached by default. Every other host is
# tunnelled untouched. Globs: `*` matches any run of characters, dots included, so
# `*.hf.co` covers `cas-bridge.xethub.hf.co`.
DEFAULT_INTERCEPT: tuple[str, ...] = (
    # The classic dataset hosts (MNIST, CIFAR, COCO, TensorFlow datasets).
    "download.tensorflow.org",
    "yann.lecun.com",
    "www.cs.toronto.edu",
    "images.cocodataset.org",
    "download.pytorch.org",
    "dl.fbaipublicfiles.com",
    "zenodo.org",
    # Hugging Face Hub: API host, LFS/Xet CDNs it redirects to.
    "huggingface.co",
    "*.huggingface.co",
    "hf.co",
    "*.hf.co",
    # Google Cloud Storage (path-style and virtual-hosted).
    "storage.googleapis.com",
    "*.storage.googleapis.com",
    "storage.cloud.google.com",
    # Amazon S3 (global, regional, dualstack, virtual-hosted).
    "s3.amazonaws.com",
    "*.s3.amazonaws.com",
    "s3.*.amazonaws.com",
    "*.s3.*.amazonaws.com",
    "s3-*.amazonaws.com",
    # Azure Blob Storage.
    "*.blob.core.windows.net",
)

# The documented maximum of objects one sidecar stores (docs/sidecar.md, `--buffer-size`).
MAX_OBJECTS = 1_000_000
# Shared memory of the core's index of answers (`--index-objects`), per object: 70 bytes
# of entries (56 each, a fifth of them spare) and, on average, 442 bytes of its answer's
# status line, fields and body file's name behind half its key's digest (a plain
# server's answer takes about 230, a cloud store's up to 800; the longer ones share the
# room of the shorter).
INDEX_MEMORY_PER_OBJECT = 512
# By default the index has room for one object per INDEX_OBJECT_SIZE of --buffer-size
# (a buffer of smaller files is indexed as far as it goes, the rest answered by Python),
# at least INDEX_OBJECTS_MIN, at most MAX_OBJECTS.
INDEX_OBJECT_SIZE = 16 * 1024
INDEX_OBJECTS_MIN = 8_192

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_HOST_GLOB_RE = re.compile(r"^[a-z0-9*]([a-z0-9*.-]*[a-z0-9*])?$")


def parse_size(text: str) -> int:
    """Parse a byte size: `512MiB`, `2Gi` (Kubernetes quantity), `10GB`, `1048576`.

    Binary suffixes (Ki, Mi, Gi, Ti, with or without a trailing B) are powers of 1024,
    decimal ones (K, M, G, T, KB...) powers of 1000, as in Kubernetes quantities.
    """
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"invalid size {text!r}: expected e.g. 512MiB, 2Gi or 10GB")
    number, unit = match.groups()
    multiplier = _SIZE_UNITS.get(unit.lower())
    if multiplier is None:
        raise ValueError(f"invalid size {text!r}: unknown unit {unit!r}")
    size = int(float(number) * multiplier)
    if size <= 0:
        raise ValueError(f"invalid size {text!r}: must be positive")
    return size


def format_size(size: int) -> str:
    """The shortest exact binary spelling of a size (`1073741824` -> `1GiB`)."""
    for unit, multiplier in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size % multiplier == 0:
            return f"{size // multiplier}{unit}"
    return str(size)


def parse_host_globs(text: str | Sequence[str]) -> tuple[str, ...]:
    """Parse comma-separated host globs (`a.example.org,*.s3.amazonaws.com`).

    Names are lower-cased; empty items are dropped; anything that is not a host name
    with optional `*` wildcards (a scheme, a port, a path) is refused.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    globs: list[str] = []
    for item in items:
        glob = item.strip().lower().rstrip(".")
        if not glob:
            continue
        if not _HOST_GLOB_RE.match(glob):
            raise ValueError(
                f"invalid host pattern {item.strip()!r}: expected a name like *.example.org"
            )
        if glob not in globs:
            globs.append(glob)
    return tuple(globs)


def host_glob_regex(glob: str) -> str:
    """A regular expression matching `host` for one host glob (`*` spans dots)."""
    return "".join(".*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", glob))


def host_matches(host: str, globs: Sequence[str]) -> bool:
    """True if `host` (a name, no port) matches one of the globs, case-insensitively."""
    return _globs_pattern(tuple(globs)).fullmatch(host.lower().rstrip(".")) is not None


@functools.lru_cache(maxsize=64)
def _globs_pattern(globs: tuple[str, ...]) -> re.Pattern[str]:
    # Asked on every request: compiled once per set of globs.
    return re.compile("|".join(f"(?:{host_glob_regex(glob)})" for glob in globs) or "(?!)")


def parse_eviction(text: str) -> Eviction:
    """Parse an eviction policy: `none` (no replacement) or `lru`."""
    value = text.strip().lower()
    if value == "none":
        return "none"
    if value == "lru":
        return "lru"
    raise ValueError(f"invalid eviction policy {text!r}: expected none or lru")


def parse_capture(text: str) -> Capture:
    """Parse a capture mode: proxy-env, hostAliases or transparent."""
    for mode in CAPTURE_MODES:
        if text.strip() == mode:
            return mode
    raise ValueError(f"invalid capture mode {text!r}: expected {', '.join(CAPTURE_MODES)}")


def _parse_int(text: str, low: int, high: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"invalid {what} {text!r}") from None
    if not low <= value <= high:
        raise ValueError(f"invalid {what} {text!r}: must be {low}-{high}")
    return value


def parse_port(text: str) -> int:
    """Parse a TCP port number (0 asks the kernel for a free one)."""
    return _parse_int(text, 0, 65535, "port")


def parse_seconds(text: str) -> float:
    """Parse a positive duration in seconds (`60`, `2.5`, `30s`)."""
    value = text.strip().lower().removesuffix("s")
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"invalid duration {text!r}: expected seconds, e.g. 60") from None
    if not 0 < seconds < 86400:
        raise ValueError(f"invalid duration {text!r}: must be between 0 and 86400 seconds")
    return seconds


def parse_stage_in(text: str | Sequence[str]) -> tuple[str, ...]:
    """Parse stage-in specs: http(s) URLs (brace ranges allowed) or `@URL` manifests.

    Specs are separated by whitespace, or by commas outside braces (so that
    `{train,val}.bin` stays one spec).
    """
    if isinstance(text, str):
        items, depth, current = [], 0, ""
        for char in text:
            depth += {"{": 1, "}": -1}.get(char, 0)
            if char.isspace() or (char == "," and depth == 0):
                items.append(current)
                current = ""
            else:
                current += char
        items.append(current)
    else:
        items = list(text)
    specs = tuple(item.strip() for item in items if item.strip())
    for spec in specs:
        if not re.match(r"^@?https?://[^/\s]+", spec):
            raise ValueError(f"invalid stage-in URL {spec!r}: expected http(s)://host/... or @URL")
        if spec.count("{") != spec.count("}"):
            raise ValueError(f"invalid stage-in URL {spec!r}: unbalanced braces")
    return specs


def parse_count(text: str) -> int:
    """Parse a count of parallel fetches or processes (1-64)."""
    return _parse_int(text, 1, 64, "count")


def parse_index_objects(text: str) -> int:
    """Parse the objects of the core's index of answers (64 to ten times MAX_OBJECTS: room
    for a buffer of small files beyond the documented maximum)."""
    return _parse_int(text, 64, 10 * MAX_OBJECTS, "object count")


def parse_proxy_url(text: str) -> str:
    """Parse an upstream proxy URL: `http://host:port` (credentials allowed)."""
    value = text.strip()
    if not re.match(r"^https?://[^/\s]+/?$", value):
        raise ValueError(f"invalid upstream proxy {text!r}: expected http://host:port")
    return value.rstrip("/")


def parse_parents(text: str | Sequence[str]) -> tuple[str, ...]:
    """Parse parent cache URLs (`http://host:port` or `https://host:port`), given as a
    repeated flag or comma-separated; duplicates dropped, order kept."""
    items = text.split(",") if isinstance(text, str) else [i for t in text for i in t.split(",")]
    parents: list[str] = []
    for item in items:
        value = item.strip().rstrip("/")
        if not value:
            continue
        if not re.match(r"^https?://[^/\s@?#]+$", value, re.IGNORECASE):
            raise ValueError(f"invalid parent {item.strip()!r}: expected http(s)://host:port")
        if value not in parents:
            parents.append(value)
    return tuple(parents)


@dataclass(frozen=True)
class Settings:
    """Everything the sidecar is told at start; built once by `parse()`."""

    # buffer_dir, required. The diskcache directory: the tmpfs/pmem/disk mount.
    buffer_dir: Path
    # listen_host, default 127.0.0.1. Where the proxy listens (loopback only in a pod).
    listen_host: str = "127.0.0.1"
    # listen_port, default 3128. The proxy's port.
    listen_port: int = 3128
    # admin_host, default 127.0.0.1. Where /healthz, /metrics and /stats listen.
    admin_host: str = "127.0.0.1"
    # admin_port, default 3129. The admin endpoints' port.
    admin_port: int = 3129
    # buffer_size, default 1 GiB (bytes). Hard cap on stored object bytes, fills included.
    buffer_size: int = 1024**3
    # eviction, default none. `none` keeps what is stored once full; `lru` evicts.
    eviction: Eviction = "none"
    # intercept, default DEFAULT_INTERCEPT. Host globs that are intercepted and cached.
    intercept: tuple[str, ...] = DEFAULT_INTERCEPT
    # ca_dir, default ~/.burstbuffer/ca. Sidecar-private (0700) home of the pod CA key.
    ca_dir: Path = field(default_factory=lambda: Path("~/.burstbuffer/ca").expanduser())
    # trust_dir, default none. Where ca.crt and ca-bundle.crt are written for the app.
    trust_dir: Path | None = None
    # upstream_ca, default none. Extra CA certificates trusted for origins.
    upstream_ca: Path | None = None
    # upstream_proxy, default none. Parent proxy (http://host:port) for upstream traffic.
    upstream_proxy: str | None = None
    # parent, default none. Shared parent caches (Squid) that misses are fetched through.
    parent: tuple[str, ...] = ()
    # parent_ca, default none. CA certificates trusted for https:// parents.
    parent_ca: Path | None = None
    # parent_timeout, default 5 (seconds). A parent silent this long before its first byte
    # is skipped for the origin.
    parent_timeout: float = 5.0
    # capture, default proxy-env. How app traffic reaches the proxy (the entrances of
    # sidecar.proxy.listeners).
    capture: Capture = "proxy-env"
    # transparent_port, default 3130. Where redirected connections arrive (transparent).
    transparent_port: int = 3130
    # upstream_timeout, default 60 (seconds). An origin silent this long is resumed.
    upstream_timeout: float = 60.0
    # revalidate, default off. Revalidate stored objects with the origin before a hit.
    revalidate: bool = False
    # http_freshness, default none. Host globs whose stored objects follow RFC 9111
    # freshness (max-age, Expires, heuristic) instead of living for the pod's lifetime.
    http_freshness: tuple[str, ...] = ()
    # parallel_fetch, default 4. Origin connections one large cold fill may use (1: off).
    parallel_fetch: int = 4
    # stage_in, default none. URLs (brace ranges, @manifests) prefetched at start.
    stage_in: tuple[str, ...] = ()
    # stage_in_parallel, default 4. How many stage-in objects are fetched at once.
    stage_in_parallel: int = 4
    # workers, default: the CPUs the container may use. Proxy processes sharing the port.
    workers: int | None = None
    # access_log, default off. One INFO line per response served from the buffer or a
    # fill (hits, misses, joins), per object stored and per one of unknown length given
    # up; passes and errors are always logged.
    access_log: bool = False
    # remember_ca_rejections, default 3600 (seconds). How long a client that refused the
    # pod CA's certificate for a host is tunnelled to that host untouched (uncached).
    remember_ca_rejections: float = 3600.0
    # index_objects, default `default_index_objects(buffer_size)`. Stored objects whose
    # answers the core's shared index holds at once (INDEX_MEMORY_PER_OBJECT bytes each).
    index_objects: int | None = None

    @property
    def index_capacity(self) -> int:
        """Objects the core's index of answers holds: `--index-objects`, or its default."""
        return self.index_objects or default_index_objects(self.buffer_size)


def default_index_objects(buffer_size: int) -> int:
    """The objects the core's index of answers holds by default for a buffer of
    `buffer_size` bytes (see INDEX_OBJECT_SIZE)."""
    return min(max(buffer_size // INDEX_OBJECT_SIZE, INDEX_OBJECTS_MIN), MAX_OBJECTS)


def index_memory(objects: int) -> int:
    """Bytes of shared memory the core's index of answers takes for `objects` objects,
    once every one of them is answered (pages are taken as answers are written)."""
    return objects * INDEX_MEMORY_PER_OBJECT


@dataclass(frozen=True)
class _Flag:
    field: str
    parse: object  # a callable str -> value; `None` for on/off switches
    help: str
    repeated: bool = False  # may be given several times (the parser gets the list)

    @property
    def option(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.field.upper()


_FLAGS: tuple[_Flag, ...] = (
    _Flag("listen_host", str, "address the proxy listens on (default 127.0.0.1)"),
    _Flag("listen_port", parse_port, "port the proxy listens on (default 3128)"),
    _Flag("admin_host", str, "address of /healthz, /metrics, /stats (default 127.0.0.1)"),
    _Flag("admin_port", parse_port, "port of the admin endpoints (default 3129)"),
    _Flag("buffer_dir", Path, "the burst buffer directory (tmpfs/pmem/disk mount); required"),
    _Flag("buffer_size", parse_size, "hard cap on stored bytes, e.g. 512MiB, 2Gi (default 1GiB)"),
    _Flag("eviction", parse_eviction, "none (keep what is stored once full) or lru (default none)"),
    _Flag("intercept", parse_host_globs, "comma-separated host globs to intercept and cache"),
    _Flag("ca_dir", Path, "private directory of the pod CA (default ~/.burstbuffer/ca)"),
    _Flag("trust_dir", Path, "where ca.crt and ca-bundle.crt are written for the app containers"),
    _Flag("upstream_ca", Path, "extra CA certificates (PEM) trusted for origins"),
    _Flag("upstream_proxy", parse_proxy_url, "parent proxy for upstream traffic, http://host:port"),
    _Flag("parent", parse_parents, "shared parent cache http(s)://host:port (repeatable)", True),
    _Flag("parent_ca", Path, "CA certificates (PEM) trusted for https:// parents"),
    _Flag("parent_timeout", parse_seconds, "seconds to a parent's first byte, then the origin (5)"),
    _Flag("capture", parse_capture, "proxy-env, hostAliases or transparent (default proxy-env)"),
    _Flag("transparent_port", parse_port, "port of the transparent listener (default 3130)"),
    _Flag("upstream_timeout", parse_seconds, "seconds an origin may stall before a resume (60)"),
    _Flag("revalidate", None, "revalidate stored objects with the origin instead of immutable"),
    _Flag("http_freshness", parse_host_globs, "host globs cached by RFC 9111 freshness rules"),
    _Flag("parallel_fetch", parse_count, "origin connections per large cold fill (4; 1=off)"),
    _Flag("stage_in", parse_stage_in, "URLs to prefetch at start: brace ranges, @manifest URLs"),
    _Flag("stage_in_parallel", parse_count, "stage-in objects fetched at once (4)"),
    _Flag("workers", parse_count, "proxy worker processes (default: the CPUs it may use)"),
    _Flag("access_log", None, "log every response and object stored (default: passes, errors)"),
    _Flag(
        "remember_ca_rejections",
        parse_seconds,
        "seconds a client that refused the pod CA is tunnelled to that host (3600)",
    ),
    _Flag(
        "index_objects",
        parse_index_objects,
        "objects the core answers alone at once (default: one per 16 KiB of --buffer-size)",
    ),
)
_FLAGS_BY_FIELD = {flag.field: flag for flag in _FLAGS}


class SettingsError(ValueError):
    """A flag or environment variable has an invalid value."""


def _env_switch(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"invalid switch value {text!r}: expected true or false")


def _argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="burstbuffer-sidecar",
        description="HTTPS-intercepting caching proxy serving datasets from a burst buffer.",
        epilog=f"Each flag may also be set as {ENV_PREFIX}<FLAG>, e.g. {ENV_PREFIX}BUFFER_SIZE=2Gi",
    )
    for flag in _FLAGS:
        if flag.parse is None:
            parser.add_argument(flag.option, action="store_true", default=None, help=flag.help)
        else:
            metavar = flag.field.split("_")[-1].upper()
            action = "append" if flag.repeated else "store"
            parser.add_argument(flag.option, metavar=metavar, action=action, help=flag.help)
    return parser


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Build the Settings from command-line flags, falling back to BURSTBUFFER_* variables.

    Raises SettingsError naming the flag (or variable) whose value is wrong.
    """
    args = vars(_argument_parser().parse_args(list(argv)))
    values: dict[str, object] = {}
    for flag in _FLAGS:
        raw = args[flag.field]
        source = flag.option
        if raw is None and flag.env in environ:
            raw, source = environ[flag.env], flag.env
            if flag.parse is None:
                try:
                    raw = _env_switch(raw)
                except ValueError as e:
                    raise SettingsError(f"{source}: {e}") from e
        if raw is None:
            continue
        if flag.parse is None:
            values[flag.field] = bool(raw)
            continue
        try:
            values[flag.field] = flag.parse(raw)  # type: ignore[operator]
        except ValueError as e:
            raise SettingsError(f"{source}: {e}") from e
    if "buffer_dir" not in values:
        raise SettingsError(f"--buffer-dir (or {ENV_PREFIX}BUFFER_DIR) is required")
    for path_field in ("buffer_dir", "ca_dir", "trust_dir", "upstream_ca", "parent_ca"):
        path = values.get(path_field)
        if isinstance(path, Path):
            values[path_field] = path.expanduser()
    return Settings(**values)  # type: ignore[arg-type]


def command_line(**values: object) -> list[str]:
    """The sidecar arguments that set the given Settings fields (the injector's view).

    `command_line(buffer_dir="/b", buffer_size=2**30, intercept=("a.org",), revalidate=True)`
    -> `["--buffer-dir", "/b", "--buffer-size", "1GiB", "--intercept", "a.org", "--revalidate"]`.
    Fields are emitted in the sidecar's own flag order; `None` values are left out.
    """
    unknown = set(values) - set(_FLAGS_BY_FIELD)
    if unknown:
        raise TypeError(f"unknown sidecar settings: {', '.join(sorted(unknown))}")
    argv: list[str] = []
    for flag in _FLAGS:
        value = values.get(flag.field)
        if value is None:
            continue
        if flag.parse is None:
            if value:
                argv.append(flag.option)
        elif flag.field == "buffer_size":
            argv += [flag.option, format_size(int(value))]  # type: ignore[call-overload]
        elif flag.field == "intercept":
            argv += [flag.option, ",".join(parse_host_globs(value))]  # type: ignore[arg-type]
        elif flag.field == "http_freshness":
            if value:
                argv += [flag.option, ",".join(parse_host_globs(value))]  # type: ignore[arg-type]
        elif flag.repeated:
            for item in value:  # type: ignore[attr-defined]
                argv += [flag.option, str(item)]
        elif flag.field == "stage_in":
            if value:
                argv += [flag.option, " ".join(parse_stage_in(value))]  # type: ignore[arg-type]
        else:
            argv += [flag.option, str(value)]
    return argv


def defaults() -> dict[str, object]:
    """The default value of every optional setting, keyed by field name."""
    return {
        f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
        for f in dataclasses.fields(Settings)
        if f.name != "buffer_dir"
    }
