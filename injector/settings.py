"""The injector's configuration: one YAML document, parsed and validated into typed settings.

The chart's ConfigMap carries exactly this document (rendered from `values.yaml`'s
`sidecar:` section and the image); `burstbuffer-injector --config F` reads it, and without
`--config` the defaults below apply. They are the chart's defaults, so a cluster installed
with the chart and `render` without a config inject the same pod.

Keys are camelCase, as in the chart. A key the injector does not know is an error naming
it (a typo silently ignored would be a setting silently not applied).

    image: ghcr.io/burstbuffer/burstbuffer:0.1.0
    imagePullPolicy: IfNotPresent
    nativeSidecar: true
    capture: proxy-env
    proxyPort: 3128
    adminPort: 3129
    transparentPort: 3130
    runAsUser: 65532
    revalidate: false
    httpFreshness: []
    prometheusAnnotations: false
    upstreamCA: {configMapName: "", key: ca.crt}
    parents: []
    parentCA: {configMapName: "", key: ca.crt}
    buffer:
      size: 1Gi
      medium: Memory
      eviction: none
      pmem: {storageClassName: "", hostPath: ""}
    intercept: [<sidecar.settings.DEFAULT_INTERCEPT>]
    noProxy: []
    trust:
      mountPath: /etc/burstbuffer/trust
      bundlePaths: [/etc/ssl/certs/ca-certificates.crt, /etc/pki/tls/certs/ca-bundle.crt,
                    /etc/ssl/cert.pem]
    resources:
      requests: {cpu: 100m, memory: 128Mi}
      limits: {memory: 256Mi}
"""

from __future__ import annotations

import dataclasses
import ipaddress
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from injector.quantity import format_bytes, parse_bytes, parse_quantity
from sidecar.settings import (
    CAPTURE_MODES,
    DEFAULT_INTERCEPT,
    Capture,
    Eviction,
    parse_eviction,
    parse_host_globs,
    parse_parents,
)

Medium = Literal["Memory", "Disk", "pmem"]
MEDIA: tuple[Medium, ...] = ("Memory", "Disk", "pmem")

PULL_POLICIES = ("Always", "IfNotPresent", "Never")

DEFAULT_IMAGE = "ghcr.io/burstbuffer/burstbuffer:0.1.0"

# Below this a buffer is mostly diskcache index (see mutate.sidecar_buffer_size).
MIN_BUFFER_SIZE = 32 * 2**20

_NO_PROXY_NAME_RE = re.compile(r"^\.?[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
_STORAGE_CLASS_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_CONFIG_MAP_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
# The sidecar's loopback listeners in the hostAliases capture (sidecar.capture): the
# proxy's other loopback ports must not take them, and the pod must let it bind them.
HOSTALIASES_PORTS = (80, 443)
_RESOURCE_NAME_RE = re.compile(r"^([a-z0-9.-]+/)?[a-zA-Z0-9]([a-zA-Z0-9._-]*[a-zA-Z0-9])?$")


class ConfigError(ValueError):
    """The injector configuration is invalid; the message names the key."""


# --- value parsers: each takes the raw YAML value and raises ValueError -------------------


def _string(raw: object) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"expected a string, got {raw!r}")
    return raw


def _nonempty_word(raw: object) -> str:
    text = _string(raw)
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"expected a non-empty string without spaces, got {raw!r}")
    return text


def _boolean(raw: object) -> bool:
    if not isinstance(raw, bool):
        raise ValueError(f"expected true or false, got {raw!r}")
    return raw


def _integer(raw: object, low: int, high: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"expected an integer, got {raw!r}")
    if not low <= raw <= high:
        raise ValueError(f"expected {low}..{high}, got {raw}")
    return raw


def _port(raw: object) -> int:
    return _integer(raw, 1, 65535)


def _uid(raw: object) -> int:
    # 0 is refused: the sidecar must run non-root (runAsNonRoot).
    return _integer(raw, 1, 2**31 - 1)


def _choice[T: str](choices: tuple[T, ...]) -> Callable[[object], T]:
    def parse(raw: object) -> T:
        if raw not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
        return cast(T, raw)

    return parse


def _eviction(raw: object) -> Eviction:
    return parse_eviction(_string(raw))


def buffer_size(raw: object) -> int:
    """A buffer size: a Kubernetes quantity (`1Gi`, `512Mi`, `10G`) of at least 32Mi."""
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise ValueError(f"expected a size such as 1Gi, got {raw!r}")
    size = parse_bytes(raw)
    if size < MIN_BUFFER_SIZE:
        raise ValueError(
            f"buffer size {raw!r} is below the minimum {format_bytes(MIN_BUFFER_SIZE)}"
        )
    return size


def _absolute_path(raw: object) -> str:
    text = _string(raw)
    if not text.startswith("/") or posixpath.normpath(text) != text or text == "/":
        raise ValueError(f"expected a normalized absolute path (not /), got {raw!r}")
    return text


def _optional_path(raw: object) -> str:
    return "" if raw == "" else _absolute_path(raw)


def _object_name(raw: object) -> str:
    """A DNS-subdomain object name (StorageClass, ConfigMap), or "" for none."""
    text = _string(raw)
    if text and not _STORAGE_CLASS_RE.match(text):
        raise ValueError(f"invalid object name {raw!r}: expected a DNS subdomain")
    return text


def _config_map_key(raw: object) -> str:
    text = _string(raw)
    if not _CONFIG_MAP_KEY_RE.match(text) or text in (".", ".."):
        raise ValueError(f"invalid ConfigMap key {raw!r}")
    return text


def _string_list(raw: object) -> list[str]:
    if not isinstance(raw, list):
        raise ValueError(f"expected a list, got {raw!r}")
    return [_string(item) for item in raw]


def _host_globs(raw: object) -> tuple[str, ...]:
    return parse_host_globs(_string_list(raw))


def no_proxy_entry(raw: str) -> str:
    """One no_proxy entry: a host name, a `.suffix` or an IP address (not a CIDR)."""
    entry = raw.strip().lower()
    try:
        ipaddress.ip_address(entry)
        return entry
    except ValueError:
        pass
    if "/" in entry:
        raise ValueError(
            f"invalid no_proxy entry {raw!r}: wget and urllib ignore CIDRs; "
            "list host names or .suffixes"
        )
    if not _NO_PROXY_NAME_RE.match(entry):
        raise ValueError(f"invalid no_proxy entry {raw!r}: expected a name or a .suffix")
    return entry


def _parents(raw: object) -> tuple[str, ...]:
    return parse_parents(_string_list(raw))


def _no_proxy(raw: object) -> tuple[str, ...]:
    return tuple(dict.fromkeys(no_proxy_entry(item) for item in _string_list(raw)))


def _bundle_paths(raw: object) -> tuple[str, ...]:
    paths = tuple(_absolute_path(item) for item in _string_list(raw))
    if len(set(paths)) != len(paths):
        raise ValueError("the same path is listed twice")
    return paths


def _quantities(raw: object) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected a mapping of resource names to quantities, got {raw!r}")
    quantities: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not _RESOURCE_NAME_RE.match(name):
            raise ValueError(f"invalid resource name {name!r}")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"{name}: expected a quantity, got {value!r}")
        try:
            parse_quantity(value)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        quantities[name] = str(value)
    return quantities


def _key(name: str, parse: Callable[[object], Any] | None = None, **kwargs: Any) -> Any:
    """A dataclass field bound to a camelCase config key (and its parser, if not a section)."""
    return field(metadata={"key": name, "parse": parse}, **kwargs)


# --- the settings ------------------------------------------------------------------------


@dataclass(frozen=True)
class PmemSettings:
    """Where a `pmem` buffer comes from; one of the two is required when medium is pmem."""

    # storageClassName, default "". A generic ephemeral volume from this StorageClass
    # (e.g. PMEM-CSI's) holds the buffer.
    storage_class_name: str = _key("storageClassName", _object_name, default="")
    # hostPath, default "". Or this node directory (a DAX-mounted pmem file system) does.
    host_path: str = _key("hostPath", _optional_path, default="")


@dataclass(frozen=True)
class BufferSettings:
    """The burst buffer volume."""

    # size, default 1Gi (bytes). The volume's sizeLimit; the sidecar's --buffer-size is
    # derived from it minus headroom for diskcache's index.
    size: int = _key("size", buffer_size, default=2**30)
    # medium, default Memory. Memory (tmpfs emptyDir), Disk (node-disk emptyDir) or pmem.
    medium: Medium = _key("medium", _choice(MEDIA), default="Memory")
    # eviction, default none. The sidecar's --eviction: none keeps what is stored once
    # full, lru evicts the least recently used.
    eviction: Eviction = _key("eviction", _eviction, default="none")
    # pmem, see PmemSettings.
    pmem: PmemSettings = _key("pmem", default_factory=PmemSettings)

    def __post_init__(self) -> None:
        if self.medium == "pmem":
            sources = [s for s in (self.pmem.storage_class_name, self.pmem.host_path) if s]
            if len(sources) != 1:
                raise ConfigError(
                    "buffer.pmem: medium pmem needs exactly one of storageClassName or hostPath"
                )


@dataclass(frozen=True)
class TrustSettings:
    """Where app containers find the pod's CA bundle."""

    # mountPath, default /etc/burstbuffer/trust. A neutral read-only directory holding
    # ca.crt and ca-bundle.crt; the CA environment variables point into it.
    mount_path: str = _key("mountPath", _absolute_path, default="/etc/burstbuffer/trust")
    # bundlePaths, default the Debian, RHEL and Alpine system bundles. Each is overlaid
    # read-only by the pod's ca-bundle.crt (subPath), for clients that only read the
    # system file (GNU wget with GnuTLS).
    bundle_paths: tuple[str, ...] = _key(
        "bundlePaths",
        _bundle_paths,
        default=(
            "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu
            "/etc/pki/tls/certs/ca-bundle.crt",  # RHEL, Fedora
            "/etc/ssl/cert.pem",  # Alpine
        ),
    )

    def __post_init__(self) -> None:
        for path in self.bundle_paths:
            if path == self.mount_path or path.startswith(self.mount_path + "/"):
                raise ConfigError(f"trust.bundlePaths: {path} lies inside trust.mountPath")


@dataclass(frozen=True)
class CASettings:
    """CA certificates from one key of a ConfigMap, mounted read-only into the sidecar
    alone: upstreamCA (origins, its --upstream-ca) or parentCA (https parents only, its
    --parent-ca)."""

    # configMapName, default "" (none). A ConfigMap in the pod's namespace holding CA
    # certificates (PEM).
    config_map_name: str = _key("configMapName", _object_name, default="")
    # key, default ca.crt. The ConfigMap key that holds them.
    key: str = _key("key", _config_map_key, default="ca.crt")


@dataclass(frozen=True)
class ResourceSettings:
    """The sidecar's own resources; the buffer is added on top (see mutate)."""

    # requests, default cpu 100m, memory 128Mi.
    requests: Mapping[str, str] = _key(
        "requests", _quantities, default_factory=lambda: {"cpu": "100m", "memory": "128Mi"}
    )
    # limits, default memory 256Mi.
    limits: Mapping[str, str] = _key(
        "limits", _quantities, default_factory=lambda: {"memory": "256Mi"}
    )

    def __post_init__(self) -> None:
        for name, limit in self.limits.items():
            request = self.requests.get(name)
            if request is not None and parse_quantity(request) > parse_quantity(limit):
                raise ConfigError(f"resources.requests.{name}: {request} exceeds the limit {limit}")


@dataclass(frozen=True)
class InjectorSettings:
    """Everything the injector puts into a pod; built once by `load()`."""

    # image, default ghcr.io/burstbuffer/burstbuffer:0.1.0. The sidecar's image.
    image: str = _key("image", _nonempty_word, default=DEFAULT_IMAGE)
    # imagePullPolicy, default IfNotPresent. Always, IfNotPresent or Never.
    image_pull_policy: str = _key("imagePullPolicy", _choice(PULL_POLICIES), default="IfNotPresent")
    # nativeSidecar, default true. The sidecar is initContainers[0] with restartPolicy
    # Always (Kubernetes >= 1.29); false makes it the first regular container instead.
    native_sidecar: bool = _key("nativeSidecar", _boolean, default=True)
    # capture, default proxy-env. How app traffic reaches the sidecar: proxy-env (proxy
    # variables), hostAliases (/etc/hosts entries) or transparent (an iptables redirect).
    capture: Capture = _key("capture", _choice(CAPTURE_MODES), default="proxy-env")
    # proxyPort, default 3128. The sidecar's proxy port on loopback.
    proxy_port: int = _key("proxyPort", _port, default=3128)
    # adminPort, default 3129. The sidecar's /healthz, /metrics and /stats port.
    admin_port: int = _key("adminPort", _port, default=3129)
    # transparentPort, default 3130. Where the transparent capture's redirect arrives.
    transparent_port: int = _key("transparentPort", _port, default=3130)
    # runAsUser, default 65532. The sidecar's numeric UID (the image's USER); not 0.
    run_as_user: int = _key("runAsUser", _uid, default=65532)
    # revalidate, default false. The sidecar's --revalidate.
    revalidate: bool = _key("revalidate", _boolean, default=False)
    # httpFreshness, default []. The sidecar's --http-freshness: host globs whose stored
    # objects follow RFC 9111 freshness instead of living for the pod's lifetime.
    http_freshness: tuple[str, ...] = _key("httpFreshness", _host_globs, default=())
    # prometheusAnnotations, default false. Injected pods get prometheus.io/scrape, /port
    # and /path naming the sidecar's admin port (unless they set prometheus.io/* themselves).
    prometheus_annotations: bool = _key("prometheusAnnotations", _boolean, default=False)
    # upstreamCA, see CASettings. Private CAs of origins; the sidecar also adds them to
    # the pod's trust bundle, so that tunnelled private hosts verify.
    upstream_ca: CASettings = _key("upstreamCA", default_factory=CASettings)
    # parents, default []. Shared parent caches (the sidecar's --parent); the chart sets
    # them from parentCache.
    parents: tuple[str, ...] = _key("parents", _parents, default=())
    # parentCA, see CASettings. The CA of the https:// parents' certificates, trusted for
    # them only: never for origins, never in the pod's trust bundle.
    parent_ca: CASettings = _key("parentCA", default_factory=CASettings)
    # buffer, see BufferSettings.
    buffer: BufferSettings = _key("buffer", default_factory=BufferSettings)
    # intercept, default sidecar.settings.DEFAULT_INTERCEPT. Host globs intercepted and cached.
    intercept: tuple[str, ...] = _key("intercept", _host_globs, default=DEFAULT_INTERCEPT)
    # noProxy, default []. Extra no_proxy entries (names, .suffixes) on top of the built-in ones.
    no_proxy: tuple[str, ...] = _key("noProxy", _no_proxy, default=())
    # trust, see TrustSettings.
    trust: TrustSettings = _key("trust", default_factory=TrustSettings)
    # resources, see ResourceSettings.
    resources: ResourceSettings = _key("resources", default_factory=ResourceSettings)

    def __post_init__(self) -> None:
        if self.parent_ca.config_map_name and not any(
            parent.lower().startswith("https://") for parent in self.parents
        ):
            raise ConfigError("parentCA: no https:// parent to trust it for")
        if self.proxy_port == self.admin_port:
            raise ConfigError(f"adminPort: {self.admin_port} is also the proxyPort")
        if self.transparent_port in (self.proxy_port, self.admin_port):
            raise ConfigError(
                f"transparentPort: {self.transparent_port} is also the proxyPort or adminPort"
            )
        loopback_ports = {"proxyPort": self.proxy_port, "transparentPort": self.transparent_port}
        for key, port in loopback_ports.items():
            if port in HOSTALIASES_PORTS:
                raise ConfigError(
                    f"{key}: {port} is taken by the hostAliases capture's loopback listeners"
                )


# --- loading and dumping -----------------------------------------------------------------


def _section_of(f: dataclasses.Field[Any]) -> type | None:
    factory = f.default_factory
    if factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory):
        return cast(type, factory)
    return None


def _build(cls: type, document: object, path: str) -> Any:
    if document is None:
        document = {}
    if not isinstance(document, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {document!r}")
    fields = {f.metadata["key"]: f for f in dataclasses.fields(cls)}
    for key in document:
        if key not in fields:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(f"{where}: unknown key (known here: {', '.join(fields)})")
    values: dict[str, Any] = {}
    for key, f in fields.items():
        if key not in document:
            continue
        where = f"{path}.{key}" if path else key
        section = _section_of(f)
        if section is not None:
            values[f.name] = _build(section, document[key], where)
            continue
        try:
            values[f.name] = f.metadata["parse"](document[key])
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    return cls(**values)


def from_document(document: object) -> InjectorSettings:
    """Settings from a parsed YAML document (a mapping; missing keys take their defaults)."""
    return cast(InjectorSettings, _build(InjectorSettings, document, ""))


def load(text: str) -> InjectorSettings:
    """Settings from YAML text (an empty document means all defaults)."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config: not valid YAML: {e}") from None
    return from_document(document)


def load_file(path: Path | None) -> InjectorSettings:
    """Settings from a YAML file, or the built-in defaults when `path` is None."""
    if path is None:
        return InjectorSettings()
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"config: cannot read {path}: {e.strerror}") from None
    return load(text)


def _dump_value(f: dataclasses.Field[Any], value: Any) -> Any:
    if f.name == "size":
        return format_bytes(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def to_document(settings: Any) -> dict[str, Any]:
    """The settings as a config document (camelCase keys), e.g. the defaults for the chart."""
    document: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        key = f.metadata["key"]
        if _section_of(f) is not None:
            document[key] = to_document(value)
        else:
            document[key] = _dump_value(f, value)
    return document
