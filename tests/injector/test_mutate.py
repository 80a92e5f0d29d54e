"""Unit tests of decide, overrides, capture and mutate: the rules, one at a time."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from podcheck import check_pod

from bench import bench_scale
from injector import names, runtimes, settings
from injector.capture import BUILTIN_NO_PROXY, find_upstream_proxy, normalize_proxy, redact
from injector.decide import ALREADY_INJECTED, HOST_NETWORK, INJECTED, OPTED_OUT, WINDOWS, decide
from injector.mutate import (
    INDEX_BYTES_PER_OBJECT,
    MAX_OBJECTS,
    TRUST_VARIABLES,
    mutate,
    sidecar_buffer_size,
    sidecar_resources,
)
from injector.overrides import pod_options
from injector.quantity import parse_bytes
from injector.settings import InjectorSettings
from sidecar import settings as sidecar_settings
from sidecar.buffer.store import Store
from sidecar.cache.policy import cache_key
from sidecar.settings import DEFAULT_INTERCEPT

OWN_PROXY = "http://127.0.0.1:3128"
BUNDLE = "/etc/burstbuffer/trust/ca-bundle.crt"


def pod(
    *containers: dict[str, Any], init: list[dict[str, Any]] | None = None, **meta: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers) or [{"name": "app", "image": "x"}]}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **meta}, "spec": spec}


def containers(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = p["spec"]
    return {c["name"]: c for c in (spec.get("initContainers") or []) + spec["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def parsed_sidecar(p: dict[str, Any]) -> sidecar_settings.Settings:
    """The injected sidecar's arguments, read by the sidecar's own parser."""
    args = containers(p)[names.CONTAINER]["args"]
    return sidecar_settings.parse([a.replace("$(POD_IP)", "10.1.2.3") for a in args], {})


# -- decide ---------------------------------------------------------------------------


def test_decide_injects_a_plain_pod() -> None:
    assert decide(pod()).inject and decide(pod()).reasons == (INJECTED,)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda p: p["metadata"].update(annotations={names.INJECT: "false"}), OPTED_OUT),
        (lambda p: p["metadata"].update(labels={names.INJECT: "False"}), OPTED_OUT),
        (lambda p: p["spec"].update(hostNetwork=True), HOST_NETWORK),
        (lambda p: p["spec"].update(os={"name": "windows"}), WINDOWS),
        (lambda p: p["spec"].update(nodeSelector={"kubernetes.io/os": "windows"}), WINDOWS),
        (lambda p: p["spec"]["containers"].append({"name": "burstbuffer"}), ALREADY_INJECTED),
    ],
)
def test_decide_never_inject_rules(change: Any, reason: Any) -> None:
    p = pod()
    change(p)
    decision = decide(p)
    assert not decision.inject and decision.reasons == (reason,)


def test_decide_reports_every_reason_and_ignores_other_values() -> None:
    p = pod(metadata={})
    p["metadata"]["annotations"] = {names.INJECT: "false"}
    p["spec"]["hostNetwork"] = True
    assert decide(p).reasons == (OPTED_OUT, HOST_NETWORK)
    assert decide(pod(labels={names.INJECT: "true"})).inject
    assert decide(pod(annotations={names.INJECT: "yes please"})).inject


# -- annotations ------------------------------------------------------------------------


def test_stage_in_is_validated_and_handed_to_the_sidecar() -> None:
    specs = "https://storage.googleapis.com/ds/shard-{0..3}.tar,\n@https://hf.co/manifest.txt"
    options = pod_options({names.STAGE_IN: specs}, InjectorSettings())
    assert options.stage_in == (
        "https://storage.googleapis.com/ds/shard-{0..3}.tar",
        "@https://hf.co/manifest.txt",
    )
    assert options.warnings == ()
    sidecar = containers(mutate(pod(annotations={names.STAGE_IN: specs}), InjectorSettings()).pod)
    args = sidecar[names.CONTAINER]["args"]
    parsed = sidecar_settings.parse([a.replace("$(POD_IP)", "10.1.2.3") for a in args], {})
    assert parsed.stage_in == options.stage_in

    elsewhere = pod_options({names.STAGE_IN: "https://data.example.org/x"}, InjectorSettings())
    assert elsewhere.stage_in == ("https://data.example.org/x",)
    assert "data.example.org is not intercepted" in elsewhere.warnings[0]
    both = {names.STAGE_IN: "https://data.example.org/x", names.INTERCEPT: "data.example.org"}
    assert pod_options(both, InjectorSettings()).warnings == ()

    bad = pod_options({names.STAGE_IN: "ftp://a.example/x"}, InjectorSettings())
    assert bad.stage_in == () and "using the default" in bad.warnings[0]


def test_overrides_apply_and_fall_back_with_warnings() -> None:
    config = InjectorSettings()
    good = pod_options(
        {
            names.BUFFER_SIZE: "4Gi",
            names.BUFFER_MEDIUM: "Disk",
            names.INTERCEPT: "data.example.org, HF.CO",
        },
        config,
    )
    assert (good.buffer.size, good.buffer.medium) == (4 * 2**30, "Disk")
    assert good.extra_intercept == ("data.example.org",)  # hf.co is intercepted already
    assert good.warnings == ()

    bad = pod_options({names.BUFFER_SIZE: "1Mi", names.BUFFER_MEDIUM: "ssd"}, config)
    assert bad.buffer == config.buffer
    assert [w.split(":")[0] for w in bad.warnings] == [names.BUFFER_MEDIUM, names.BUFFER_SIZE]
    assert "below the minimum" in bad.warnings[1]


def test_http_freshness_adds_the_pods_hosts_to_the_configured_ones() -> None:
    config = settings.load("httpFreshness: [huggingface.co]")
    annotated = pod(annotations={names.HTTP_FRESHNESS: "HuggingFace.co,*.hf.co"})
    result = mutate(annotated, config)
    assert not result.warnings
    assert parsed_sidecar(result.pod).http_freshness == ("huggingface.co", "*.hf.co")
    status = json.loads(result.pod["metadata"]["annotations"][names.STATUS])
    assert status["httpFreshness"] == ["*.hf.co"]
    assert parsed_sidecar(mutate(pod(), InjectorSettings()).pod).http_freshness == ()

    # Only a plain name can be known not to be intercepted; a glob may match some hosts.
    outside = pod_options({names.HTTP_FRESHNESS: "pypi.org,*.example.org"}, InjectorSettings())
    assert outside.extra_http_freshness == ("pypi.org", "*.example.org")
    assert len(outside.warnings) == 1 and "pypi.org is not intercepted" in outside.warnings[0]
    both = {names.HTTP_FRESHNESS: "pypi.org", names.INTERCEPT: "pypi.org"}
    assert pod_options(both, InjectorSettings()).warnings == ()


@pytest.mark.parametrize("value", ["https://pypi.org/simple", "pypi.org:443", "a b.org"])
def test_a_bad_http_freshness_is_a_warning_and_the_configured_hosts_stay(value: str) -> None:
    config = settings.load("httpFreshness: [huggingface.co]")
    result = mutate(pod(annotations={names.HTTP_FRESHNESS: value}), config)
    assert list(result.warnings) == [
        f"{names.HTTP_FRESHNESS}: invalid host pattern {value!r}: expected a name like "
        "*.example.org; using the default"
    ]
    assert parsed_sidecar(result.pod).http_freshness == ("huggingface.co",)


def test_pmem_by_annotation_needs_a_configured_source() -> None:
    assert pod_options({names.BUFFER_MEDIUM: "pmem"}, InjectorSettings()).buffer.medium == "Memory"
    config = settings.load("buffer: {pmem: {hostPath: /mnt/pmem}}")
    options = pod_options({names.BUFFER_MEDIUM: "pmem"}, config)
    assert options.buffer.medium == "pmem" and options.warnings == ()


# -- capture ------------------------------------------------------------------------------


def test_proxy_spellings() -> None:
    assert normalize_proxy(" proxy.corp:3128 ") == "http://proxy.corp:3128"
    assert normalize_proxy("http://u:p@proxy:8080/") == "http://u:p@proxy:8080"
    assert redact("http://u:p@proxy:8080") == "http://proxy:8080"
    for bad in ("socks5://proxy:1080", "[", "http://:3128", "proxy:99999", "proxy:0"):
        with pytest.raises(ValueError):
            normalize_proxy(bad)


def test_upstream_proxy_is_the_first_seen_and_ours_is_not_one() -> None:
    found = find_upstream_proxy(
        [
            {"name": "a", "env": [{"name": "http_proxy", "value": OWN_PROXY}]},
            {"name": "b", "env": [{"name": "ALL_PROXY", "value": "http://ignored:1"}]},
            {"name": "c", "env": [{"name": "HTTP_PROXY", "value": "p1:3128"}]},
            {"name": "d", "env": [{"name": "https_proxy", "value": "socks5://s:1080"}]},
            {"name": "e", "env": [{"name": "https_proxy", "value": "http://p2:3128"}]},
        ],
        OWN_PROXY,
    )
    assert found.url == "http://p1:3128"
    assert len(found.warnings) == 2
    assert "container d: https_proxy is not an http proxy URL" in found.warnings[0]
    assert "uses http://p1:3128 (c) and ignores http://p2:3128 (e)" in found.warnings[1]


# -- mutate -------------------------------------------------------------------------------


def test_buffer_headroom() -> None:
    assert sidecar_buffer_size(32 * 2**20) == 11 * 2**20
    assert sidecar_buffer_size(2**30) == 848 * 2**20
    # A million objects at most: beyond 4 GiB the index's room stops growing.
    room = 640 * 10**6 + 16 * 2**20
    assert sidecar_buffer_size(100 * 2**30) == (100 * 2**30 - room) // 2**20 * 2**20
    assert sidecar_buffer_size(10**9) % 2**20 == 0


# A cloud object store's response fields, as the sidecar stores them (vendor fields kept).
_CLOUD_FIELDS = (
    ("x-amz-id-2", "x" * 76),
    ("x-amz-request-id", "Y" * 16),
    ("Date", "Mon, 01 Jan 2024 00:00:00 GMT"),
    ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT"),
    ("ETag", '"0123456789abcdef0123456789abcdef"'),
    ("x-amz-server-side-encryption", "AES256"),
    ("x-amz-version-id", "Z" * 32),
    ("Accept-Ranges", "bytes"),
    ("Content-Type", "image/jpeg"),
    ("Server", "AmazonS3"),
)


@pytest.mark.parametrize("fields", [_CLOUD_FIELDS[:3], _CLOUD_FIELDS], ids=["three", "cloud"])
def test_the_volume_keeps_room_for_the_index_of_every_object_it_can_hold(
    tmp_path: Path, fields: tuple[tuple[str, str], ...]
) -> None:
    """The index of real objects, made by the sidecar's store, fits the room the injector
    keeps for it: per object, and so at the documented maximum of a million objects."""
    store = Store(tmp_path, 2**40, "none")
    store.open()
    count = 2000
    for n in range(count):
        reservation = store.reserve(1024)
        assert reservation is not None
        Path(reservation.path).write_bytes(bytes(1024))
        url = f"https://datasets.example.org/imagenet/train/n01440764/img-{n:08d}.JPEG"
        store.commit(reservation, cache_key(url), "ab" * 32, fields, 1.7e9, 0.0)
    store.close()
    index = sum(p.stat().st_size for p in (tmp_path / "index").iterdir())
    assert index / count <= INDEX_BYTES_PER_OBJECT
    for volume in (32 * 2**20, 2**30, 4 * 2**30, 100 * 2**30):
        objects = min(volume // store.charge(1024), MAX_OBJECTS)
        assert volume - sidecar_buffer_size(volume) >= objects * index / count


# The core's index of answers is charged to the memory whatever the medium: 512 bytes for
# each 16 KiB of --buffer-size, in whole MiB: 27 MiB for the default 1 GiB volume (a
# buffer of 848 MiB), 279 MiB for a 10 GB one.
@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("", {"requests": {"cpu": "100m", "memory": "1179Mi"}, "limits": {"memory": "1307Mi"}}),
        ("buffer: {medium: Disk, size: 10G}", {
            "requests": {"cpu": "100m", "memory": "407Mi", "ephemeral-storage": "10G"},
            "limits": {"memory": "535Mi"},
        }),
        ("buffer: {medium: pmem, pmem: {storageClassName: sc}}", {
            "requests": {"cpu": "100m", "memory": "155Mi"}, "limits": {"memory": "283Mi"},
        }),
        ("resources: {requests: {}, limits: {memory: 100M}}", {"limits": {"memory": "1202053376"}}),
    ],
)  # fmt: skip
def test_the_buffer_is_charged_to_the_sidecar(config: str, expected: dict[str, Any]) -> None:
    s = settings.load(config)
    assert sidecar_resources(s, pod_options({}, s)) == expected


def test_sidecar_flags_read_back_with_the_sidecars_parser() -> None:
    config = settings.load("revalidate: true\nbuffer: {eviction: lru}\nproxyPort: 8888\n")
    p = pod(annotations={names.INTERCEPT: "datasets.example.org"})
    injected = mutate(p, config).pod
    sidecar = containers(injected)[names.CONTAINER]
    parsed = parsed_sidecar(injected)
    assert (parsed.listen_host, parsed.listen_port) == ("127.0.0.1", 8888)
    assert (parsed.admin_host, parsed.admin_port) == ("10.1.2.3", 3129)
    assert parsed.buffer_size == sidecar_buffer_size(2**30)
    assert parsed.eviction == "lru" and parsed.revalidate
    assert parsed.intercept == (*DEFAULT_INTERCEPT, "datasets.example.org")
    assert str(parsed.ca_dir) == names.CA_PRIVATE_DIR
    assert str(parsed.trust_dir) == names.TRUST_DIR
    assert parsed.upstream_proxy is None
    assert sidecar["env"][0]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_every_container_trusts_and_only_the_sidecar_holds_the_ca() -> None:
    p = pod(
        {"name": "app", "image": "x"},
        {"name": "side", "image": "y", "restartPolicy": None},
        init=[
            {"name": "prep", "image": "z"},
            {"name": "logs", "image": "z", "restartPolicy": "Always"},
        ],
    )
    del p["spec"]["containers"][1]["restartPolicy"]
    injected = mutate(p, InjectorSettings()).pod
    check_pod(injected)
    all_containers = containers(injected)
    sidecar = all_containers.pop(names.CONTAINER)
    ca_volume = next(m["name"] for m in sidecar["volumeMounts"] if m["mountPath"] == names.CA_DIR)
    assert set(all_containers) == {"app", "side", "prep", "logs"}
    for container in all_containers.values():
        mounts = container["volumeMounts"]
        assert all(m["readOnly"] for m in mounts), container["name"]
        assert ca_volume not in {m["name"] for m in mounts}
        assert {m["mountPath"] for m in mounts} == {
            "/etc/burstbuffer/trust",
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
            "/etc/ssl/cert.pem",
        }
        env = env_of(container)
        assert all(env[name] == BUNDLE for name in TRUST_VARIABLES)
        assert env["https_proxy"] == env["HTTP_PROXY"] == OWN_PROXY
    # The native sidecar comes before the pod's own init containers.
    assert [c["name"] for c in injected["spec"]["initContainers"]] == [
        "burstbuffer",
        "prep",
        "logs",
    ]


def test_no_proxy_keeps_what_the_container_had() -> None:
    p = pod({"name": "app", "env": [{"name": "NO_PROXY", "value": "corp.example, 10.0.0.0/8"}]})
    config = settings.load("noProxy: [.internal.example]")
    env = env_of(containers(mutate(p, config).pod)["app"])
    expected = [*BUILTIN_NO_PROXY, ".internal.example", "corp.example", "10.0.0.0/8"]
    assert env["no_proxy"].split(",") == env["NO_PROXY"].split(",") == expected


def test_an_existing_proxy_becomes_the_upstream_proxy_and_survives_a_second_pass() -> None:
    p = pod({"name": "app", "env": [{"name": "https_proxy", "value": "proxy.corp:3128"}]})
    once = mutate(p, InjectorSettings())
    args = containers(once.pod)[names.CONTAINER]["args"]
    assert args[args.index("--upstream-proxy") + 1] == "http://proxy.corp:3128"
    assert env_of(containers(once.pod)["app"])["https_proxy"] == OWN_PROXY
    assert (
        '"upstreamProxy":"http://proxy.corp:3128"'
        in once.pod["metadata"]["annotations"][names.STATUS]
    )
    assert mutate(once.pod, InjectorSettings()).pod == once.pod


def test_replaced_trust_variables_and_taken_paths_are_warned_about() -> None:
    p = pod(
        {
            "name": "app",
            "env": [
                {
                    "name": "REQUESTS_CA_BUNDLE",
                    "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
                }
            ],
            "volumeMounts": [{"name": "corp", "mountPath": "/etc/ssl/cert.pem/"}],
        }
    )
    p["spec"]["volumes"] = [{"name": "corp", "configMap": {"name": "corp-ca"}}]
    injected = mutate(p, InjectorSettings())
    assert injected.warnings == (
        "container app: /etc/ssl/cert.pem is already mounted from volume corp; "
        "the pod CA is not added there",
        "container app: REQUESTS_CA_BUNDLE is replaced by the pod's CA bundle",
    )
    assert env_of(containers(injected.pod)["app"])["REQUESTS_CA_BUNDLE"] == BUNDLE


def test_classic_mode() -> None:
    config = settings.load("nativeSidecar: false")
    injected = mutate(pod(init=[{"name": "prep", "image": "z"}]), config).pod
    check_pod(injected)
    init = injected["spec"]["initContainers"]
    regular = injected["spec"]["containers"]
    assert [c["name"] for c in init] == [names.INIT_CONTAINER, "prep"]
    assert [c["name"] for c in regular] == [names.CONTAINER, "app"]
    sidecar, prime = regular[0], init[0]
    assert "restartPolicy" not in sidecar
    assert sidecar["lifecycle"]["postStart"]["exec"]["command"][:2] == [
        "burstbuffer-injector",
        "wait",
    ]
    assert prime["command"][:2] == ["burstbuffer-injector", "prime"]
    assert (
        prime["command"][prime["command"].index("--") + 1 :] == sidecar["command"] + sidecar["args"]
    )
    # The pod's own init containers run before the proxy: trust, but no proxy.
    assert "https_proxy" not in env_of(init[1]) and env_of(init[1])["SSL_CERT_FILE"] == BUNDLE
    assert env_of(regular[1])["https_proxy"] == OWN_PROXY
    # The prime does not fill the buffer: no buffer in its resources.
    assert prime["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }


def test_switching_modes_converges() -> None:
    native, classic = InjectorSettings(), settings.load("nativeSidecar: false")
    p = pod()
    assert mutate(mutate(p, native).pod, classic).pod == mutate(p, classic).pod
    assert mutate(mutate(p, classic).pod, native).pod == mutate(p, native).pod


def test_pmem_host_path_buffers_are_per_pod() -> None:
    config = settings.load("buffer: {medium: pmem, pmem: {hostPath: /mnt/pmem0}}")
    injected = mutate(pod(), config).pod
    sidecar = containers(injected)[names.CONTAINER]
    assert (
        sidecar["args"][sidecar["args"].index("--buffer-dir") + 1]
        == f"{names.BUFFER_DIR}/$(POD_UID)"
    )
    assert {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}} in sidecar[
        "env"
    ]
    volume = next(v for v in injected["spec"]["volumes"] if v["name"] == names.BUFFER_VOLUME)
    assert volume["hostPath"] == {"path": "/mnt/pmem0", "type": "Directory"}


def test_mutate_does_not_touch_its_input_and_keeps_unknown_fields() -> None:
    p = pod({"name": "app", "image": "x", "futureField": {"a": 1}})
    p["spec"]["someNewPodField"] = True
    before = copy.deepcopy(p)
    injected = mutate(p, InjectorSettings()).pod
    assert p == before
    assert injected["spec"]["someNewPodField"] is True
    assert containers(injected)["app"]["futureField"] == {"a": 1}


def test_memory_limits_add_up_exactly() -> None:
    config = settings.load("buffer: {size: 1.5Gi}\nresources: {limits: {memory: 300M}}")
    sidecar = containers(mutate(pod(), config).pod)[names.CONTAINER]
    # The limit, the buffer, and the core's index of its 1,280 MiB (512 bytes per 16 KiB).
    index = 1280 * 2**20 // 2**14 * 512
    assert parse_bytes(sidecar["resources"]["limits"]["memory"]) == 300 * 10**6 + 3 * 2**29 + index


def test_a_volume_like_our_ca_volume_that_the_app_mounts_is_not_taken_for_the_ca() -> None:
    lookalike = {"name": names.CA_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    p = pod({"name": "app", "volumeMounts": [{"name": names.CA_VOLUME, "mountPath": "/scratch"}]})
    p["spec"]["volumes"] = [lookalike]
    injected = mutate(p, InjectorSettings()).pod
    sidecar = containers(injected)[names.CONTAINER]
    ca = next(m["name"] for m in sidecar["volumeMounts"] if m["mountPath"] == names.CA_DIR)
    assert ca == f"{names.CA_VOLUME}-1"
    assert injected["spec"]["volumes"][0] == lookalike


def test_a_pod_with_a_container_named_like_ours_is_left_alone() -> None:
    decision = decide(pod({"name": names.INIT_CONTAINER, "image": "x"}))
    assert not decision.inject and decision.reasons == (ALREADY_INJECTED,)


# -- capture modes -----------------------------------------------------------------------


def flag(container: dict[str, Any], name: str) -> str | None:
    args = container["args"]
    return args[args.index(name) + 1] if name in args else None


def test_host_aliases_map_exact_names_and_skip_globs() -> None:
    config = settings.load("capture: hostAliases")
    p = pod(annotations={names.INTERCEPT: "datasets.example.org, *.mirror.example"})
    injected = mutate(p, config)
    check_pod(injected.pod)
    spec = injected.pod["spec"]
    (entry,) = spec["hostAliases"]
    assert entry["ip"] == "127.0.0.1"
    mapped = entry["hostnames"]
    # Every exact default name, the pod's extra, and the known CDN names the globs cover.
    assert {n for n in DEFAULT_INTERCEPT if "*" not in n} | {"datasets.example.org"} <= set(mapped)
    assert {"cdn-lfs.hf.co", "cas-bridge.xethub.hf.co"} <= set(mapped)
    assert not [n for n in mapped if "*" in n]
    status = json.loads(injected.pod["metadata"]["annotations"][names.STATUS])
    assert status["capture"] == "hostAliases"
    assert status["notAliased"] == [*(g for g in DEFAULT_INTERCEPT if "*" in g), "*.mirror.example"]
    assert spec["securityContext"]["sysctls"] == [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "80"}
    ]
    sidecar = containers(injected.pod)[names.CONTAINER]
    assert flag(sidecar, "--capture") == "hostAliases"
    assert flag(sidecar, "--transparent-port") is None
    # Trust as always, but no proxy variables: only dataset traffic meets the sidecar.
    env = env_of(containers(injected.pod)["app"])
    assert env["SSL_CERT_FILE"] == BUNDLE
    assert not set(env) & {"https_proxy", "HTTPS_PROXY", "http_proxy", "no_proxy"}
    assert injected.warnings == ()
    assert mutate(injected.pod, config).pod == injected.pod


def test_known_cdn_names_follow_the_globs() -> None:
    config = settings.load("capture: hostAliases\nintercept: [huggingface.co]")
    (entry,) = mutate(pod(), config).pod["spec"]["hostAliases"]
    assert entry["hostnames"] == ["huggingface.co"]


def test_host_aliases_merge_with_the_pods_own() -> None:
    config = settings.load("capture: hostAliases\nintercept: [a.example, b.example]")
    p = pod()
    p["spec"]["hostAliases"] = [
        {"ip": "10.0.0.5", "hostnames": ["db.example", "b.example"]},
        {"ip": "127.0.0.1", "hostnames": ["a.example"]},  # the sidecar's address already
    ]
    injected = mutate(p, config)
    assert injected.pod["spec"]["hostAliases"] == [
        {"ip": "10.0.0.5", "hostnames": ["db.example", "b.example"]},
        {"ip": "127.0.0.1", "hostnames": ["a.example"]},
    ]
    assert injected.warnings == (
        "hostAliases: the pod maps b.example itself; its downloads bypass the sidecar",
    )
    status = json.loads(injected.pod["metadata"]["annotations"][names.STATUS])
    assert status["notAliased"] == ["b.example"]
    assert mutate(injected.pod, config).pod == injected.pod


@pytest.mark.parametrize(
    ("value", "expected", "warned"), [("0", "0", False), ("80", "80", False), ("1024", "80", True)]
)
def test_the_port_sysctl_is_only_ever_lowered(value: str, expected: str, warned: bool) -> None:
    p = pod()
    p["spec"]["securityContext"] = {
        "runAsUser": 1000,
        "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": value}],
    }
    injected = mutate(p, settings.load("capture: hostAliases"))
    context = injected.pod["spec"]["securityContext"]
    assert context["runAsUser"] == 1000
    assert context["sysctls"] == [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": expected}
    ]
    assert bool(injected.warnings) == warned


def test_host_aliases_with_a_classic_sidecar_warn_the_init_containers() -> None:
    config = settings.load("capture: hostAliases\nnativeSidecar: false")
    injected = mutate(pod(init=[{"name": "prep", "image": "z"}]), config)
    assert any("unreachable" in w for w in injected.warnings)
    assert not mutate(pod(), config).warnings


def test_transparent_adds_the_redirect_first_and_no_proxy_variables() -> None:
    config = settings.load("capture: transparent\ntransparentPort: 15001\nrunAsUser: 1337")
    injected = mutate(pod(init=[{"name": "prep", "image": "z"}]), config)
    check_pod(injected.pod)
    init = injected.pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == [names.REDIRECT_CONTAINER, names.CONTAINER, "prep"]
    redirect = init[0]
    assert redirect["command"] == [
        "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp",
        "-m", "multiport", "--dports", "80,443", "-m", "owner", "!", "--uid-owner", "1337",
        "-j", "REDIRECT", "--to-ports", "15001",
    ]  # fmt: skip
    assert redirect["image"] == config.image
    context = redirect["securityContext"]
    assert context["runAsUser"] == 0 and context["runAsNonRoot"] is False
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]}
    assert context["allowPrivilegeEscalation"] is False
    sidecar = init[1]
    assert flag(sidecar, "--capture") == "transparent"
    assert flag(sidecar, "--transparent-port") == "15001"
    assert sidecar["securityContext"]["runAsUser"] == 1337
    for name in ("prep", "app"):
        env = env_of(containers(injected.pod)[name])
        assert env["SSL_CERT_FILE"] == BUNDLE and "https_proxy" not in env
    assert "hostAliases" not in injected.pod["spec"]
    assert mutate(injected.pod, config).pod == injected.pod


def test_transparent_with_a_classic_sidecar_redirects_after_the_pods_init_containers() -> None:
    config = settings.load("capture: transparent\nnativeSidecar: false")
    injected = mutate(pod(init=[{"name": "prep", "image": "z"}]), config).pod
    check_pod(injected)
    assert [c["name"] for c in injected["spec"]["initContainers"]] == [
        names.INIT_CONTAINER,
        "prep",
        names.REDIRECT_CONTAINER,
    ]
    assert [c["name"] for c in injected["spec"]["containers"]] == [names.CONTAINER, "app"]


def test_a_container_that_names_a_proxy_is_pointed_at_the_sidecar_in_every_mode() -> None:
    p = pod(
        {"name": "app", "image": "x"},
        {"name": "egress", "image": "y", "env": [{"name": "HTTPS_PROXY", "value": "corp:3128"}]},
    )
    for mode in ("hostAliases", "transparent"):
        injected = mutate(p, settings.load(f"capture: {mode}")).pod
        assert "https_proxy" not in env_of(containers(injected)["app"])
        assert env_of(containers(injected)["egress"])["https_proxy"] == OWN_PROXY
        assert flag(containers(injected)[names.CONTAINER], "--upstream-proxy") == "http://corp:3128"


def test_containers_with_the_sidecars_uid_are_warned_about() -> None:
    config = settings.load("capture: transparent")
    p = pod({"name": "app", "image": "x", "securityContext": {"runAsUser": 65532}})
    assert mutate(p, config).warnings == (
        "container app runs as the sidecar's UID 65532: its traffic is not captured",
    )
    p["spec"]["securityContext"] = {"runAsUser": 65532}
    p["spec"]["containers"][0]["securityContext"] = {"runAsUser": 1000}
    assert mutate(p, config).warnings == ()
    # An init container that inherits the UID: captured with a native sidecar, while a
    # classic one's init containers run before the redirect anyway.
    p["spec"]["initContainers"] = [{"name": "prep", "image": "z"}]
    assert len(mutate(p, config).warnings) == 1
    assert mutate(p, replace(config, native=False)).warnings == ()


@pytest.mark.parametrize(
    ("value", "mode"), [("transparent", "transparent"), (" hostAliases", "hostAliases")]
)
def test_the_capture_annotation_overrides_the_configuration(value: str, mode: str) -> None:
    injected = mutate(pod(annotations={names.CAPTURE: value}), InjectorSettings())
    assert injected.warnings == ()
    assert json.loads(injected.pod["metadata"]["annotations"][names.STATUS])["capture"] == mode
    assert flag(containers(injected.pod)[names.CONTAINER], "--capture") == mode


def test_a_bad_capture_annotation_keeps_the_configured_mode() -> None:
    injected = mutate(pod(annotations={names.CAPTURE: "iptables"}), InjectorSettings())
    assert injected.warnings == (
        f"{names.CAPTURE}: invalid capture mode 'iptables': expected proxy-env, hostAliases, "
        "transparent; using the default",
    )
    assert "--capture" not in containers(injected.pod)[names.CONTAINER]["args"]


@pytest.mark.parametrize("mode", sidecar_settings.CAPTURE_MODES)
def test_capture_flags_read_back_with_the_sidecars_parser(mode: str) -> None:
    config = settings.load(f"capture: {mode}")
    parsed = parsed_sidecar(mutate(pod(), config).pod)
    assert parsed.capture == mode and parsed.transparent_port == config.transparent_port


# -- upstream CA and Prometheus ----------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "volume_name", "field", "status_key"),
    [
        ("upstreamCA: {configMapName: corp-ca, key: root.pem}", "upstream-ca", "upstream_ca",
         "upstreamCA"),
        # The parent's CA is trusted for the parent alone: not --upstream-ca, which the
        # sidecar also trusts for origins and copies into the pod's trust bundle.
        ("parents: [https://parent.svc:3129]\nparentCA: {configMapName: corp-ca, key: root.pem}",
         "parent-ca", "parent_ca", "parentCA"),
    ],
    ids=["upstreamCA", "parentCA"],
)  # fmt: skip
def test_a_configured_ca_reaches_the_sidecar_only(
    document: str, volume_name: str, field: str, status_key: str
) -> None:
    config = settings.load(document)
    for native in (True, False):
        injected = mutate(pod(init=[{"name": "prep", "image": "z"}]), replace(config, native))
        check_pod(injected.pod)
        volume = next(v for v in injected.pod["spec"]["volumes"] if "configMap" in v)
        assert volume == {
            "name": f"burstbuffer-{volume_name}",
            "configMap": {
                "name": "corp-ca",
                "items": [{"key": "root.pem", "path": "root.pem"}],
                "defaultMode": 0o644,
            },
        }
        everything = containers(injected.pod)
        holders = {
            name
            for name, c in everything.items()
            if volume["name"] in {m["name"] for m in c.get("volumeMounts") or []}
        }
        assert holders == ({names.CONTAINER} if native else {names.CONTAINER, names.INIT_CONTAINER})
        parsed = parsed_sidecar(injected.pod)
        path = f"/var/lib/burstbuffer/{volume_name}/root.pem"
        assert {str(parsed.upstream_ca), str(parsed.parent_ca)} == {path, "None"}
        assert str(getattr(parsed, field)) == path
        status = json.loads(injected.pod["metadata"]["annotations"][names.STATUS])
        assert status[status_key] == "corp-ca"
        assert mutate(injected.pod, replace(config, native)).pod == injected.pod


def replace(config: InjectorSettings, native: bool) -> InjectorSettings:
    return dataclasses.replace(config, native_sidecar=native)


def prometheus_of(p: dict[str, Any]) -> dict[str, str]:
    annotations = p["metadata"]["annotations"]
    return {k: v for k, v in annotations.items() if k.startswith(names.PROMETHEUS)}


def test_prometheus_annotations_name_the_admin_port() -> None:
    config = settings.load("prometheusAnnotations: true\nadminPort: 9100")
    injected = mutate(pod(annotations={"team": "ml"}), config)
    assert prometheus_of(injected.pod) == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9100",
        "prometheus.io/path": "/metrics",
    }
    assert injected.pod["metadata"]["annotations"]["team"] == "ml"
    assert injected.warnings == ()
    assert mutate(injected.pod, config) == injected
    # Off by default.
    assert prometheus_of(mutate(pod(), InjectorSettings()).pod) == {}


def test_a_pods_own_prometheus_annotations_win() -> None:
    config = settings.load("prometheusAnnotations: true")
    own = {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"}
    injected = mutate(pod(annotations=own), config)
    assert prometheus_of(injected.pod) == own
    assert injected.warnings == (
        "the pod sets prometheus.io/port itself; the sidecar's metrics are not announced "
        "to Prometheus",
    )


def _sidecar_of(p: dict[str, Any], config: InjectorSettings) -> dict[str, Any]:
    return containers(mutate(p, config).pod)[names.CONTAINER]


def _workers_flag(sidecar: dict[str, Any]) -> int:
    args = sidecar["args"]
    return int(args[args.index("--workers") + 1])


def test_the_sidecar_runs_one_worker_by_default() -> None:
    sidecar = _sidecar_of(pod(), settings.load(""))
    assert _workers_flag(sidecar) == 1
    assert sidecar["resources"]["requests"]["cpu"] == "100m"


@pytest.mark.parametrize(
    ("cpu", "workers", "memory_limit"),
    [("2", 2, "1435Mi"), ("1500m", 2, "1435Mi"), ("4", 4, "1691Mi"), ("0.5", 1, "1307Mi")],
)
def test_sidecar_cpu_sets_the_request_the_workers_and_their_memory(
    cpu: str, workers: int, memory_limit: str
) -> None:
    config = settings.load("")
    sidecar = _sidecar_of(pod(annotations={names.SIDECAR_CPU: cpu}), config)
    assert _workers_flag(sidecar) == workers
    assert sidecar["resources"]["requests"]["cpu"] == cpu
    # 256Mi for the sidecar with one worker + the 1Gi buffer + the core's index of it
    # (27Mi), 128Mi per further worker.
    assert sidecar["resources"]["limits"]["memory"] == memory_limit
    parsed = sidecar_settings.parse(sidecar["args"], {})
    assert parsed.workers == workers


def test_a_two_worker_sidecar_gets_the_memory_the_scale_bench_holds_it_to() -> None:
    """`python -m bench --only scale` requires a two-worker sidecar on a million stored
    objects, after 200,000 distinct hits, to stay within PSS_LIMIT_MB: the injected limit
    (a Disk buffer, so the sidecar's own) is at least that."""
    config = settings.load("buffer: {medium: Disk}")
    sidecar = _sidecar_of(pod(annotations={names.SIDECAR_CPU: "2"}), config)
    limit = parse_bytes(sidecar["resources"]["limits"]["memory"])
    assert limit >= bench_scale.PSS_LIMIT_MB * bench_scale.MB


def test_a_configured_cpu_limit_decides_the_workers_and_is_raised_to_the_request() -> None:
    config = settings.load("resources: {requests: {cpu: 1}, limits: {cpu: 3, memory: 1Gi}}")
    assert _workers_flag(_sidecar_of(pod(), config)) == 3
    sidecar = _sidecar_of(pod(annotations={names.SIDECAR_CPU: "6"}), config)
    assert sidecar["resources"]["limits"]["cpu"] == "6"
    assert _workers_flag(sidecar) == 6


@pytest.mark.parametrize("cpu", ["0", "-1", "lots", "65", ""])
def test_a_bad_sidecar_cpu_is_a_warning_and_the_default_stays(cpu: str) -> None:
    config = settings.load("")
    result = mutate(pod(annotations={names.SIDECAR_CPU: cpu}), config)
    assert any(names.SIDECAR_CPU in warning for warning in result.warnings)
    assert _workers_flag(containers(result.pod)[names.CONTAINER]) == 1


# -- clients that ignore the proxy variables ------------------------------------------

TRUST_STORE_OPTIONS = (
    "-Djavax.net.ssl.trustStore=/etc/burstbuffer/trust/ca-bundle.p12"
    " -Djavax.net.ssl.trustStoreType=PKCS12"
)


@pytest.mark.parametrize("mode", sidecar_settings.CAPTURE_MODES)
def test_runtime_variables_by_capture_mode(mode: str) -> None:
    config = settings.load(f"capture: {mode}\n")
    env = env_of(containers(mutate(pod(), config).pod)["app"])
    java = env[runtimes.JAVA_TOOL_OPTIONS]
    # The trust store everywhere; proxy properties, fsspec and Node only with proxy-env.
    assert java.startswith(TRUST_STORE_OPTIONS)
    if mode == "proxy-env":
        assert "-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=3128" in java
        assert "-Dhttp.nonProxyHosts=localhost|127.0.0.1|::1|*.svc|*.cluster.local|" in java
        assert json.loads(env[runtimes.FSSPEC_HTTP]) == {"client_kwargs": {"trust_env": True}}
        assert env[runtimes.NODE_USE_ENV_PROXY] == "1"
    else:
        assert java == TRUST_STORE_OPTIONS
        assert runtimes.FSSPEC_HTTP not in env and runtimes.NODE_USE_ENV_PROXY not in env


def test_runtime_variables_keep_the_containers_own_values() -> None:
    own = {"name": "app", "image": "x", "env": [
        {"name": "JAVA_TOOL_OPTIONS", "value": "-Xmx2g"},
        {"name": "FSSPEC_HTTP", "value": '{"block_size": 0, "client_kwargs": {"timeout": 9}}'},
    ]}  # fmt: skip
    config = settings.load("")
    once = mutate(pod(own), config).pod
    env = env_of(containers(once)["app"])
    assert env["JAVA_TOOL_OPTIONS"].startswith("-Xmx2g " + TRUST_STORE_OPTIONS)
    assert json.loads(env["FSSPEC_HTTP"]) == {
        "block_size": 0,
        "client_kwargs": {"timeout": 9, "trust_env": True},
    }
    assert mutate(once, config).pod == once  # appended once, merged once


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        (None, '{"client_kwargs":{"trust_env":true}}'),
        ("", '{"client_kwargs":{"trust_env":true}}'),
        ('{"client_kwargs": {"trust_env": false}}', '{"client_kwargs":{"trust_env":true}}'),
    ],
)
def test_fsspec_http_is_merged(existing: str | None, expected: str) -> None:
    assert runtimes.fsspec_http(existing) == expected


@pytest.mark.parametrize("bad", ["[1]", "not json", '{"client_kwargs": 3}'])
def test_fsspec_http_that_is_not_an_object_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        runtimes.fsspec_http(bad)


def test_java_non_proxy_hosts() -> None:
    assert runtimes.java_non_proxy_hosts("localhost, .svc,,10.0.0.1") == "localhost|*.svc|10.0.0.1"
