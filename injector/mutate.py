"""Pod -> injected pod: the sidecar, its volumes, trust in every container, and the capture.

Pure: a deep copy of a plain dict in, a new dict out, plus warnings for the pod's owner.
Plain dicts on purpose: a typed model (the `kubernetes` package's V1Pod) drops the fields
its version does not know, and the diff of the two would then delete them from the pod.

Idempotent by construction, not by a guard: every step replaces what an earlier pass
added (our containers by name, our volumes by content, our mounts by path, variables by
name), so `mutate(mutate(p)) == mutate(p)`. The one thing an earlier pass hides is the
pod's own proxy (its containers then point at the sidecar); it is read back from the
existing sidecar's `--upstream-proxy`. Switching the capture mode applies to new pods: a
pod injected with one mode and mutated again with another keeps the first one's wiring
(the webhook never mutates an injected pod again).

`rewire` is what the webhook does instead with a pod that already has the sidecar (a
second call for the same pod, after another webhook changed it): the containers added
since are wired to the sidecar the pod has, which is left as it is.
"""

from __future__ import annotations

import copy
import importlib.metadata
import itertools
import json
import logging
import math
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from injector import aliases, capture, names, redirect, runtimes
from injector.overrides import PodOptions, pod_options
from injector.quantity import format_bytes, parse_bytes, parse_quantity
from injector.settings import BufferSettings, CASettings, InjectorSettings
from sidecar.settings import (
    CAPTURE_MODES,
    MAX_OBJECTS,
    command_line,
    default_index_objects,
    index_memory,
)

logger = logging.getLogger(__name__)

# Every variable a common client reads for its CA file; all point to the pod's bundle.
TRUST_VARIABLES = (
    "SSL_CERT_FILE",  # OpenSSL (curl, Python ssl, Ruby, Go's crypto/x509 too)
    "REQUESTS_CA_BUNDLE",  # Python requests, which ignores the system file
    "CURL_CA_BUNDLE",  # curl
    "NODE_EXTRA_CA_CERTS",  # Node.js (added to its built-in roots)
    "AWS_CA_BUNDLE",  # AWS CLI and boto3
    "PIP_CERT",  # pip
)

# The buffer's index (SQLite and its WAL) lives in the same volume as the objects and is
# not counted by the sidecar's --buffer-size; it grows with the number of objects, not
# their size. The sidecar charges each object at least one 4 KiB block against its cap
# (`sidecar.buffer.store.Store.charge`), so a volume of V bytes never holds more than V/4096
# objects, nor more than MAX_OBJECTS, the documented maximum (docs/sidecar.md, `--buffer-size`).
# The volume keeps INDEX_BYTES_PER_OBJECT for each of those, and _INDEX_SLACK for the WAL
# and SQLite's free pages. Measured (`python -m bench --only scale`): 270–290 bytes an
# object with three response fields, about 600 with a cloud store's ten (tests/injector
# pins both).
INDEX_BYTES_PER_OBJECT = 640
_BLOCK = 4096
_INDEX_SLACK = 16 * 2**20
# Memory of each sidecar worker process beyond the first: a worker maps about 85 MiB
# (mitmproxy, TLS contexts, its connections' buffers); forked from a fork server, about
# 15 MiB of it is its own at first, the rest shared until the worker touches it. It does
# not grow with the objects stored (it remembers them in at most 16 MiB): at the
# documented maximum of 1,000,000 stored objects, after 200,000 distinct hits, a worker
# held about 97 MB (PSS) and a two-worker sidecar 250–267 MB, within 256Mi + 128Mi
# (`python -m bench --only scale`).
WORKER_MEMORY = 128 * 2**20

# Tiny volumes of the sidecar: the CA key (tmpfs, so the key never reaches the node's
# disk) and the trust files (a CA bundle is a few hundred KiB).
_CA_VOLUME = {"emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
_TRUST_VOLUME = {"emptyDir": {"sizeLimit": "16Mi"}}
# 0644 written out: the API server stores the default, and a second pass compares the
# stored volume with this one to recognise it.
_CONFIG_MAP_MODE = 0o644

# The startup probe lets the pod's other containers start as soon as the proxy is up; the
# liveness probe is lenient, since /healthz shares a process with multi-GB transfers.
_STARTUP_PROBE = {"periodSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 120}
_LIVENESS_PROBE = {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6}

_VERSION = importlib.metadata.version("burstbuffer")


@dataclass(frozen=True)
class Mutation:
    """The injected pod and what its owner should be told."""

    pod: dict[str, Any]
    warnings: tuple[str, ...]


def index_room(volume_size: int) -> int:
    """Bytes of a buffer volume of `volume_size` bytes kept for the index of as many
    objects as it can hold (see INDEX_BYTES_PER_OBJECT)."""
    return min(volume_size // _BLOCK, MAX_OBJECTS) * INDEX_BYTES_PER_OBJECT + _INDEX_SLACK


def sidecar_buffer_size(volume_size: int) -> int:
    """The sidecar's --buffer-size for a volume of `volume_size` bytes (whole MiB)."""
    return (volume_size - index_room(volume_size)) // 2**20 * 2**20


def index_charge(volume_size: int) -> int:
    """The memory of the core's index of answers for a buffer volume of `volume_size`
    bytes (`sidecar.settings.index_memory` of the sidecar's default `--index-objects`), in
    whole MiB so that the limits stay readable."""
    index = index_memory(default_index_objects(sidecar_buffer_size(volume_size)))
    return -(-index // 2**20) * 2**20


def sidecar_workers(resources: Mapping[str, Mapping[str, str]]) -> int:
    """The sidecar's worker processes: one per CPU of its CPU limit, else of its request
    (rounded up), at least one."""
    cpu = resources.get("limits", {}).get("cpu") or resources.get("requests", {}).get("cpu")
    return max(1, math.ceil(parse_quantity(cpu))) if cpu else 1


def sidecar_resources(settings: InjectorSettings, options: PodOptions) -> dict[str, Any]:
    """The sidecar's resources, with its workers and the buffer charged where the kernel
    charges them.

    The configured memory covers the sidecar with one worker process; each further
    worker (one per CPU) adds WORKER_MEMORY, and the core's index of answers its shared
    memory (`sidecar.settings.index_memory`), whatever the medium. tmpfs pages count
    against the memory cgroup of the process that writes them (the sidecar), and a disk
    emptyDir against the pod's ephemeral storage: without the buffer in the limit, a full
    buffer gets the sidecar OOM-killed or the pod evicted.
    """
    buffer = options.buffer
    requests = dict(settings.resources.requests)
    limits = dict(settings.resources.limits)
    if options.sidecar_cpu is not None:
        requests["cpu"] = options.sidecar_cpu
        if "cpu" in limits and parse_quantity(limits["cpu"]) < parse_quantity(requests["cpu"]):
            limits["cpu"] = options.sidecar_cpu
    extra_workers = sidecar_workers({"requests": requests, "limits": limits}) - 1
    index = index_charge(buffer.size)
    for amounts in (requests, limits):
        if "memory" in amounts:
            amounts["memory"] = format_bytes(
                parse_bytes(amounts["memory"]) + extra_workers * WORKER_MEMORY + index
            )
    charged = {"Memory": "memory", "Disk": "ephemeral-storage"}.get(buffer.medium)
    if charged is not None:
        if charged in limits:
            limits[charged] = format_bytes(parse_bytes(limits[charged]) + buffer.size)
        if charged in requests:
            requests[charged] = format_bytes(parse_bytes(requests[charged]) + buffer.size)
        elif charged not in limits:
            # No request and no limit: request the buffer, so the scheduler counts it.
            # (With only a limit, the request defaults to the limit, which includes it.)
            requests[charged] = format_bytes(buffer.size)
    return _resources(requests, limits)


def _resources(requests: Mapping[str, str], limits: Mapping[str, str]) -> dict[str, Any]:
    pairs = (("requests", requests), ("limits", limits))
    return {key: dict(value) for key, value in pairs if value}


def buffer_volume(buffer: BufferSettings) -> dict[str, Any]:
    """The buffer volume's source (without its name) for the buffer's medium."""
    size = format_bytes(buffer.size)
    if buffer.medium == "Memory":
        return {"emptyDir": {"medium": "Memory", "sizeLimit": size}}
    if buffer.medium == "Disk":
        return {"emptyDir": {"sizeLimit": size}}
    if buffer.pmem.storage_class_name:
        claim = {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": buffer.pmem.storage_class_name,
            "resources": {"requests": {"storage": size}},
        }
        return {"ephemeral": {"volumeClaimTemplate": {"spec": claim}}}
    return {"hostPath": {"path": buffer.pmem.host_path, "type": "Directory"}}


def ca_volume(ca: CASettings) -> dict[str, Any]:
    """The volume source of a configured CA ConfigMap (its one key)."""
    key = ca.key
    return {
        "configMap": {
            "name": ca.config_map_name,
            "items": [{"key": key, "path": key}],
            "defaultMode": _CONFIG_MAP_MODE,
        }
    }


def _buffer_dir(buffer: BufferSettings) -> str:
    # A hostPath directory is shared by every pod on the node: each sidecar keeps its
    # buffer in a subdirectory named after its pod's UID, which it creates itself (a
    # kubelet-made subPath directory would be root's and not writable by the sidecar).
    if buffer.medium == "pmem" and not buffer.pmem.storage_class_name:
        return f"{names.BUFFER_DIR}/$({names.POD_UID})"
    return names.BUFFER_DIR


def _choose_volume_name(
    volumes: list[dict[str, Any]], stem: str, source: dict[str, Any], taken: set[str]
) -> str:
    """`stem`, or `stem-1`, `stem-2`...: the first name that is free or already ours.

    A volume equal to ours is ours (an earlier pass added it) unless its name is in
    `taken`: the CA volume mounted by an app container is the pod's own, never the CA's.
    """
    by_name = {v.get("name"): v for v in volumes}
    for n in itertools.count():
        name = stem if n == 0 else f"{stem}-{n}"
        existing = by_name.get(name)
        if existing is None or (existing == {"name": name, **source} and name not in taken):
            return name
    raise AssertionError("unreachable")


def _upsert(items: list[dict[str, Any]], key: str, item: dict[str, Any]) -> list[dict[str, Any]]:
    """`items` with `item` replacing the entry of the same `key`, or appended."""
    for i, existing in enumerate(items):
        if existing.get(key) == item[key]:
            return [*items[:i], item, *items[i + 1 :]]
    return [*items, item]


def _sidecar_env(buffer: BufferSettings) -> list[dict[str, Any]]:
    env = [{"name": names.POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    if "$(" + names.POD_UID + ")" in _buffer_dir(buffer):
        env.append(
            {"name": names.POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
        )
    return env


def sidecar_intercept(settings: InjectorSettings, options: PodOptions) -> tuple[str, ...]:
    """The host globs the pod's sidecar intercepts: the configured ones and the pod's extras."""
    return settings.intercept + options.extra_intercept


def _sidecar_args(
    settings: InjectorSettings, options: PodOptions, upstream_proxy: str | None, workers: int
) -> list[str]:
    return command_line(
        # Always given: without a CPU limit the sidecar would see every CPU of the node.
        workers=workers,
        listen_host="127.0.0.1",
        listen_port=settings.proxy_port,
        # The kubelet probes (and Prometheus scrapes) the pod IP; the proxy stays on loopback.
        admin_host=f"$({names.POD_IP})",
        admin_port=settings.admin_port,
        buffer_dir=_buffer_dir(options.buffer),
        buffer_size=sidecar_buffer_size(options.buffer.size),
        eviction=options.buffer.eviction,
        intercept=sidecar_intercept(settings, options),
        ca_dir=names.CA_PRIVATE_DIR,
        trust_dir=names.TRUST_DIR,
        upstream_ca=(
            f"{names.UPSTREAM_CA_DIR}/{settings.upstream_ca.key}"
            if settings.upstream_ca.config_map_name
            else None
        ),
        upstream_proxy=upstream_proxy,
        parent=settings.parents or None,
        parent_ca=(
            f"{names.PARENT_CA_DIR}/{settings.parent_ca.key}"
            if settings.parent_ca.config_map_name
            else None
        ),
        # Left out for proxy-env, the sidecar's default: pods keep the spec they always had.
        capture=None if options.capture == "proxy-env" else options.capture,
        transparent_port=settings.transparent_port if options.capture == "transparent" else None,
        revalidate=settings.revalidate,
        http_freshness=settings.http_freshness + options.extra_http_freshness,
        stage_in=options.stage_in or None,
    )


def _security_context(settings: InjectorSettings) -> dict[str, Any]:
    return {
        "runAsUser": settings.run_as_user,
        "runAsGroup": settings.run_as_user,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _sidecar_mounts(volume_names: Mapping[str, str]) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": volume_names[names.BUFFER_VOLUME], "mountPath": names.BUFFER_DIR},
        {"name": volume_names[names.CA_VOLUME], "mountPath": names.CA_DIR},
        {"name": volume_names[names.TRUST_VOLUME], "mountPath": names.TRUST_DIR},
    ]
    for stem, path in (
        (names.UPSTREAM_CA_VOLUME, names.UPSTREAM_CA_DIR),
        (names.PARENT_CA_VOLUME, names.PARENT_CA_DIR),
    ):
        if stem in volume_names:
            mounts.append({"name": volume_names[stem], "mountPath": path, "readOnly": True})
    return mounts


def _sidecar(
    settings: InjectorSettings,
    options: PodOptions,
    volume_names: Mapping[str, str],
    upstream_proxy: str | None,
) -> dict[str, Any]:
    def health() -> dict[str, Any]:
        return {"httpGet": {"path": "/healthz", "port": settings.admin_port}}

    resources = sidecar_resources(settings, options)
    container: dict[str, Any] = {
        "name": names.CONTAINER,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["burstbuffer-sidecar"],
        "args": _sidecar_args(settings, options, upstream_proxy, sidecar_workers(resources)),
        "env": _sidecar_env(options.buffer),
        "ports": [
            {"name": names.ADMIN_PORT_NAME, "containerPort": settings.admin_port, "protocol": "TCP"}
        ],
        "startupProbe": {**health(), **_STARTUP_PROBE},
        "livenessProbe": {**health(), **_LIVENESS_PROBE},
        "resources": resources,
        "securityContext": _security_context(settings),
        "volumeMounts": _sidecar_mounts(volume_names),
    }
    if settings.native_sidecar:
        container["restartPolicy"] = "Always"
    else:
        # Classic sidecar: the kubelet starts the next container only once postStart
        # returns, so the app starts with the proxy up (Istio's holdApplicationUntilProxyStarts).
        container["lifecycle"] = {
            "postStart": {
                "exec": {
                    "command": [
                        "burstbuffer-injector",
                        "wait",
                        "--port",
                        str(settings.admin_port),
                    ]
                }
            }
        }
    return container


def _prime_container(sidecar: Mapping[str, Any], settings: InjectorSettings) -> dict[str, Any]:
    """Classic mode's first init container: runs the sidecar until its trust files exist.

    The pod's own init containers run before any regular container, so before the classic
    sidecar; their subPath mounts of ca-bundle.crt need the file to exist (a subPath to a
    missing file becomes a directory and the container fails).
    """
    return {
        "name": names.INIT_CONTAINER,
        "image": sidecar["image"],
        "imagePullPolicy": sidecar["imagePullPolicy"],
        "command": [
            "burstbuffer-injector",
            "prime",
            "--port",
            str(settings.admin_port),
            "--",
            *sidecar["command"],
            *sidecar["args"],
        ],
        "env": copy.deepcopy(sidecar["env"]),
        # It fills no buffer: the configured resources, without the buffer's share.
        "resources": _resources(settings.resources.requests, settings.resources.limits),
        "securityContext": copy.deepcopy(sidecar["securityContext"]),
        "volumeMounts": copy.deepcopy(sidecar["volumeMounts"]),
    }


def _trust_mounts(volume: str, settings: InjectorSettings) -> list[dict[str, Any]]:
    mounts = [{"name": volume, "mountPath": settings.trust.mount_path, "readOnly": True}]
    for path in settings.trust.bundle_paths:
        mounts.append(
            {"name": volume, "mountPath": path, "subPath": names.BUNDLE_FILE, "readOnly": True}
        )
    return mounts


def _wire_container(
    container: dict[str, Any],
    trust_volume: str,
    variables: Mapping[str, str],
    settings: InjectorSettings,
    warnings: list[str],
) -> dict[str, Any]:
    """One app container with the trust mounts and the given variables."""
    cname = container.get("name", "?")
    mounts = list(container.get("volumeMounts") or [])
    for mount in _trust_mounts(trust_volume, settings):
        path = mount["mountPath"]
        taken = [
            m
            for m in mounts
            if posixpath.normpath(str(m.get("mountPath", ""))) == path
            and m.get("name") != trust_volume
        ]
        if taken:
            warnings.append(
                f"container {cname}: {path} is already mounted from volume "
                f"{taken[0].get('name')}; the pod CA is not added there"
            )
            continue
        mounts = _upsert(mounts, "mountPath", mount)
    env = list(container.get("env") or [])
    own_values = set(variables.values())
    for name, value in variables.items():
        previous = next((e for e in env if e.get("name") == name), None)
        if (
            name in TRUST_VARIABLES
            and previous is not None
            and previous.get("value") not in own_values
        ):
            warnings.append(f"container {cname}: {name} is replaced by the pod's CA bundle")
        env = _upsert(env, "name", {"name": name, "value": value})
    return {**container, "volumeMounts": mounts, "env": env}


def _sidecar_flag(containers: list[dict[str, Any]], key: str) -> str | None:
    """The value of the flag `key` (a Settings field) of a sidecar injected by an earlier
    pass, if any."""
    flag = command_line(**{key: "-"})[0]
    for container in containers:
        if container.get("name") == names.CONTAINER:
            args = [str(a) for a in container.get("args") or []]
            if flag in args[:-1]:
                return args[args.index(flag) + 1]
    return None


def status(
    settings: InjectorSettings,
    options: PodOptions,
    volume_names: Mapping[str, str],
    upstream_proxy: str | None,
    not_aliased: tuple[str, ...],
) -> str:
    """The burstbuffer.io/status annotation: what was injected, as compact JSON."""
    record: dict[str, Any] = {
        "version": _VERSION,
        "container": names.CONTAINER,
        "sidecar": "native" if settings.native_sidecar else "classic",
        "capture": options.capture,
        "buffer": {
            "medium": options.buffer.medium,
            "size": format_bytes(options.buffer.size),
            "eviction": options.buffer.eviction,
        },
        "volumes": sorted(volume_names.values()),
    }
    if options.extra_intercept:
        record["intercept"] = list(options.extra_intercept)
    if options.extra_http_freshness:
        record["httpFreshness"] = list(options.extra_http_freshness)
    if not_aliased:
        # Intercepted, but left out by the hostAliases capture (globs, names the pod maps).
        record["notAliased"] = list(not_aliased)
    if upstream_proxy:
        record["upstreamProxy"] = capture.redact(upstream_proxy)
    if settings.upstream_ca.config_map_name:
        record["upstreamCA"] = settings.upstream_ca.config_map_name
    if settings.parent_ca.config_map_name:
        record["parentCA"] = settings.parent_ca.config_map_name
    if options.stage_in:
        # A count, not the list: a job may stage thousands of URLs (annotations are small).
        record["stageIn"] = len(options.stage_in)
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def _wirer(
    settings: InjectorSettings, mode: str, own_url: str, trust_volume: str, warnings: list[str]
) -> Callable[[dict[str, Any], bool], dict[str, Any]]:
    """`wired(container, proxied)`: an app container wired to the sidecar (trust always;
    the proxy when `proxied` and the capture mode says so)."""
    bundle = f"{settings.trust.mount_path}/{names.BUNDLE_FILE}"
    trust_store = f"{settings.trust.mount_path}/{names.TRUST_STORE_FILE}"
    trust_variables = {name: bundle for name in TRUST_VARIABLES}

    def wired(container: dict[str, Any], proxied: bool) -> dict[str, Any]:
        variables = dict(trust_variables)
        proxy_url: str | None = None
        # With hostAliases or transparent, a container that names a proxy would send its
        # traffic there, past the capture: it is pointed at the sidecar as with proxy-env.
        if proxied and (mode == "proxy-env" or capture.names_a_proxy(container)):
            variables.update(capture.proxy_variables(container, own_url, settings.no_proxy))
            proxy_url = own_url
        # Clients that ignore the variables above: fsspec, Node, the JVM.
        no_proxy = variables.get(capture.NO_PROXY_VARIABLES[0], "")
        found, notes = runtimes.variables(container, trust_store, proxy_url, no_proxy)
        variables.update(found)
        warnings.extend(notes)
        return _wire_container(container, trust_volume, variables, settings, warnings)

    return wired


def _arranged(
    sidecar: dict[str, Any],
    prime: dict[str, Any] | None,
    redirects: list[dict[str, Any]],
    init: list[dict[str, Any]],
    regular: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's init containers and containers, ours in their places: a native sidecar
    (no `prime` container) or a classic one."""
    if prime is None:
        # The redirect first: every later container, the pod's own init containers
        # included, starts with the rule in place and the sidecar listening.
        return [*redirects, sidecar, *init], regular
    # The redirect last: the pod's own init containers run before the classic sidecar
    # and download directly; the rule is in place before the sidecar and the app start.
    return [prime, *init, *redirects], [sidecar, *regular]


def _is_own(container: Mapping[str, Any]) -> bool:
    return container.get("name") in names.OWN_CONTAINERS


def _prometheus_annotations(
    annotations: dict[str, Any], settings: InjectorSettings, warnings: list[str]
) -> None:
    """Plain Prometheus' scrape annotations naming the sidecar, unless the pod has its own."""
    ours = {
        names.PROMETHEUS_SCRAPE: "true",
        names.PROMETHEUS_PORT: str(settings.admin_port),
        names.PROMETHEUS_PATH: "/metrics",
    }
    theirs = [
        k for k, v in annotations.items() if k.startswith(names.PROMETHEUS) and ours.get(k) != v
    ]
    if theirs:
        # One port per pod: the application's own metrics win.
        warnings.append(
            f"the pod sets {', '.join(sorted(theirs))} itself; "
            "the sidecar's metrics are not announced to Prometheus"
        )
        return
    annotations.update(ours)


def _volumes(
    spec: dict[str, Any], settings: InjectorSettings, options: PodOptions, app_mounts: set[Any]
) -> dict[str, str]:
    """Add the sidecar's volumes to the pod; returns their names by stem."""
    volumes = list(spec.get("volumes") or [])
    sources = {
        names.BUFFER_VOLUME: buffer_volume(options.buffer),
        names.CA_VOLUME: _CA_VOLUME,
        names.TRUST_VOLUME: _TRUST_VOLUME,
    }
    if settings.upstream_ca.config_map_name:
        sources[names.UPSTREAM_CA_VOLUME] = ca_volume(settings.upstream_ca)
    if settings.parent_ca.config_map_name:
        sources[names.PARENT_CA_VOLUME] = ca_volume(settings.parent_ca)
    volume_names: dict[str, str] = {}
    for stem, source in sources.items():
        # Names the pod's own containers mount are never taken for the CA's private volume.
        taken = app_mounts if stem == names.CA_VOLUME else set()
        volume_names[stem] = name = _choose_volume_name(volumes, stem, source, taken)
        volumes = _upsert(volumes, "name", {"name": name, **copy.deepcopy(source)})
    spec["volumes"] = volumes
    return volume_names


def _map_hosts(
    spec: dict[str, Any], patterns: tuple[str, ...], warnings: list[str]
) -> tuple[str, ...]:
    """The hostAliases capture's changes to the pod spec; returns what it left out."""
    mapping = aliases.map_hosts(spec.get("hostAliases"), patterns)
    spec["hostAliases"] = mapping.host_aliases
    spec["securityContext"], sysctl_warnings = aliases.with_port_sysctl(spec.get("securityContext"))
    warnings += [*mapping.warnings, *sysctl_warnings]
    return mapping.skipped


def _redirect(
    settings: InjectorSettings,
    captured: list[dict[str, Any]],
    pod_context: object,
    warnings: list[str],
) -> dict[str, Any]:
    """The transparent capture's init container; warns about containers it cannot capture."""
    for container in captured:
        if redirect.shares_sidecar_uid(container, pod_context, settings.run_as_user):
            warnings.append(
                f"container {container.get('name', '?')} runs as the sidecar's UID "
                f"{settings.run_as_user}: its traffic is not captured"
            )
    return redirect.redirect_container(
        settings.image, settings.image_pull_policy, settings.transparent_port, settings.run_as_user
    )


def mutate(original: Mapping[str, Any], settings: InjectorSettings) -> Mutation:
    """The pod with its burstbuffer sidecar; see the module docstring."""
    pod = copy.deepcopy(dict(original))
    metadata = pod["metadata"] = dict(pod.get("metadata") or {})
    spec = pod["spec"] = dict(pod.get("spec") or {})
    annotations = dict(metadata.get("annotations") or {})
    options = pod_options(annotations, settings)
    warnings = list(options.warnings)
    mode = options.capture

    everything = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    init = [c for c in spec.get("initContainers") or [] if not _is_own(c)]
    regular = [c for c in spec.get("containers") or [] if not _is_own(c)]

    own_url = capture.sidecar_proxy_url(settings.proxy_port)
    found = capture.find_upstream_proxy(init + regular, own_url)
    warnings += found.warnings
    upstream_proxy = found.url or _sidecar_flag(everything, "upstream_proxy")

    app_mounts = {m.get("name") for c in init + regular for m in c.get("volumeMounts") or []}
    volume_names = _volumes(spec, settings, options, app_mounts)

    wired = _wirer(settings, mode, own_url, volume_names[names.TRUST_VOLUME], warnings)
    sidecar = _sidecar(settings, options, volume_names, upstream_proxy)
    # A native sidecar is up before the pod's own init containers, which are then proxied
    # too; a classic one only starts after them, so they get trust but no proxy.
    init = [wired(c, settings.native_sidecar) for c in init]
    regular = [wired(c, True) for c in regular]

    not_aliased: tuple[str, ...] = ()
    if mode == "hostAliases":
        not_aliased = _map_hosts(spec, sidecar_intercept(settings, options), warnings)
        if init and not settings.native_sidecar:
            warnings.append(
                "init containers run before the classic sidecar: the dataset hosts, mapped "
                "to it by hostAliases, are unreachable from them"
            )
    redirects: list[dict[str, Any]] = []
    if mode == "transparent":
        # Redirected: what starts after the rule (with a classic sidecar, the pod's own
        # init containers run before it).
        captured = init + regular if settings.native_sidecar else regular
        redirects = [_redirect(settings, captured, spec.get("securityContext"), warnings)]

    prime = None if settings.native_sidecar else _prime_container(sidecar, settings)
    spec["initContainers"], spec["containers"] = _arranged(sidecar, prime, redirects, init, regular)

    if settings.prometheus_annotations:
        _prometheus_annotations(annotations, settings, warnings)
    annotations[names.STATUS] = status(settings, options, volume_names, upstream_proxy, not_aliased)
    metadata["annotations"] = annotations
    return Mutation(pod, tuple(dict.fromkeys(warnings)))


def _mounted_at(container: Mapping[str, Any], path: str) -> str | None:
    """The name of the volume `container` mounts at `path`, if any."""
    for mount in container.get("volumeMounts") or []:
        if mount.get("mountPath") == path:
            return str(mount.get("name"))
    return None


def _recorded_capture(metadata: Mapping[str, Any]) -> str | None:
    """The capture mode the status annotation of an injected pod records, if readable."""
    raw = (metadata.get("annotations") or {}).get(names.STATUS)
    try:
        record = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    mode = record.get("capture") if isinstance(record, dict) else None
    return mode if mode in CAPTURE_MODES else None


def rewire(original: Mapping[str, Any], settings: InjectorSettings) -> Mutation | None:
    """An injected pod with every app container wired to its sidecar; None when the pod
    has no sidecar of ours to wire them to (a container merely named like ours).

    A webhook called after the injector may add containers; with `reinvocationPolicy:
    IfNeeded` the API server then calls the injector again, with the pod as it is. The
    app containers that do not mount the pod's trust volume (the added ones) are wired
    as `mutate` wires the pod's own, with the capture mode and proxy port of the sidecar
    the pod has; everything else injected is left as it is (the API server filled in its
    defaults in between), and our containers are put back in their places, before an
    init container added in front of them.
    """
    pod = copy.deepcopy(dict(original))
    metadata = pod["metadata"] = dict(pod.get("metadata") or {})
    spec = pod["spec"] = dict(pod.get("spec") or {})
    init_all = list(spec.get("initContainers") or [])
    regular_all = list(spec.get("containers") or [])
    native = any(c.get("name") == names.CONTAINER for c in init_all)
    sidecar = next((c for c in init_all + regular_all if c.get("name") == names.CONTAINER), None)
    prime = next((c for c in init_all if c.get("name") == names.INIT_CONTAINER), None)
    mode = _recorded_capture(metadata)
    trust_volume = _mounted_at(sidecar, names.TRUST_DIR) if sidecar is not None else None
    if sidecar is None or trust_volume is None or mode is None or (prime is None) != native:
        return None

    port = _sidecar_flag(init_all + regular_all, "listen_port")
    own_url = capture.sidecar_proxy_url(int(port) if port else settings.proxy_port)
    warnings: list[str] = []
    wired = _wirer(settings, mode, own_url, trust_volume, warnings)

    def added(container: Mapping[str, Any]) -> bool:
        mounts = container.get("volumeMounts") or []
        return not _is_own(container) and all(m.get("name") != trust_volume for m in mounts)

    # A proxy that an added container names cannot become the sidecar's upstream any more.
    proxied = [c for c in (init_all if native else []) + regular_all if added(c)]
    found = capture.find_upstream_proxy(proxied, own_url)
    warnings += found.warnings
    if found.url and found.url != _sidecar_flag(init_all + regular_all, "upstream_proxy"):
        warnings.append(
            f"containers added after the injection name the proxy {capture.redact(found.url)}; "
            "they are pointed at the sidecar, which does not use it"
        )
    init = [wired(c, native) if added(c) else c for c in init_all if not _is_own(c)]
    regular = [wired(c, True) if added(c) else c for c in regular_all if not _is_own(c)]
    redirects = [c for c in init_all if c.get("name") == names.REDIRECT_CONTAINER]
    spec["initContainers"], spec["containers"] = _arranged(sidecar, prime, redirects, init, regular)
    return Mutation(pod, tuple(dict.fromkeys(warnings)))
