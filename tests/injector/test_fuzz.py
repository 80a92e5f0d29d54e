"""Property-based tests: generated pods and reviews, in-process and against the real server.

For any pod the API server could send: the review is allowed, the patched pod is one the
API server accepts (1.29 and newest schemas, plus the rules schemas cannot express), a
second review changes nothing, `mutate` converges, and the CA volume stays the sidecar's.
For any body at all: the server answers with a status it means, never a 500.
For a pod with a wrong type or a missing required field at any depth, alone, in a
Deployment or in a List: `render` exits 2 with one line naming the field from the top
of its input, and the webhook refuses the pod naming it. For a pod with any node
replaced by anything: `render` writes a manifest or one error line, never a traceback,
and the webhook allows or refuses (400), never fails.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import trustme
import yaml
from cli import render_in_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from podcheck import admission_review, apply, check_pod, decoded_patch
from webhook import Webhook, start_webhook, write_pair

from injector import names, review
from injector import settings as settings_module
from injector.capture import NO_PROXY_VARIABLES, PROXY_VARIABLES
from injector.mutate import TRUST_VARIABLES, mutate
from injector.settings import InjectorSettings

CONFIGS = (
    InjectorSettings(),
    InjectorSettings(native_sidecar=False),
    settings_module.load("capture: hostAliases\nprometheusAnnotations: true"),
    settings_module.load("capture: transparent\nupstreamCA: {configMapName: corp-ca}"),
    settings_module.load("capture: transparent\nnativeSidecar: false"),
)

label = st.from_regex(r"[a-z]([a-z0-9-]{0,6}[a-z0-9])?", fullmatch=True)
# Names that collide with ours, next to ordinary ones.
volume_name = st.one_of(
    label,
    st.sampled_from(
        [names.BUFFER_VOLUME, names.CA_VOLUME, names.TRUST_VOLUME, f"{names.TRUST_VOLUME}-1"]
    ),
)
mount_path = st.one_of(
    st.sampled_from(
        ["/data", "/etc/ssl/certs", "/etc/ssl/cert.pem", "/etc/burstbuffer/trust", "/cache"]
        + list(InjectorSettings().trust.bundle_paths)
    ),
    label.map(lambda x: f"/mnt/{x}"),
)
env_name = st.one_of(
    st.sampled_from([*PROXY_VARIABLES, *NO_PROXY_VARIABLES, *TRUST_VARIABLES, "ALL_PROXY"]),
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True),
)
env_value = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "http://proxy.corp:3128",
            "proxy.corp:8080",
            "http://user:pw@p:3128/",
            "socks5://s:1080",
            "http://127.0.0.1:3128",
            ".corp,10.0.0.0/8",
            "$(OTHER)",
            "",
        ]
    ),
)
env_entry = st.one_of(
    st.builds(lambda n, v: {"name": n, "value": v}, env_name, env_value),
    st.builds(
        lambda n: {"name": n, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, env_name
    ),
)
volume = st.builds(
    lambda name, kind: {"name": name, **kind},
    volume_name,
    st.sampled_from(
        [
            {"emptyDir": {}},
            {"emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},  # like our CA volume
            {"emptyDir": {"sizeLimit": "16Mi"}},  # like our trust volume
            {"configMap": {"name": "corp-ca"}},
        ]
    ),
)
annotation_values = {
    names.BUFFER_SIZE: st.sampled_from(["2Gi", "512Mi", "1Mi", "lots", "10G", ""]),
    names.BUFFER_MEDIUM: st.sampled_from(["Memory", "Disk", "pmem", "ssd"]),
    names.INTERCEPT: st.sampled_from(["a.example", "*.b.example, c.example", "https://x/y", ""]),
    names.STAGE_IN: st.sampled_from(["https://a.example/x", "ftp://a/x", "https://a/x http://b/y"]),
    names.INJECT: st.sampled_from(["true", "false", "maybe"]),
    names.CAPTURE: st.sampled_from(["proxy-env", "hostAliases", "transparent", "iptables", ""]),
    names.PROMETHEUS_SCRAPE: st.sampled_from(["true", "false"]),
    names.PROMETHEUS_PORT: st.sampled_from(["3129", "8080"]),
}
annotations = st.fixed_dictionaries({}, optional=annotation_values)
# The pod's own /etc/hosts entries, some naming dataset hosts, some looking like ours.
host_alias = st.builds(
    lambda ip, hostnames: {"ip": ip, "hostnames": hostnames},
    st.sampled_from(["127.0.0.1", "10.0.0.7", "::1"]),
    st.lists(
        st.sampled_from(["huggingface.co", "zenodo.org", "a.example", "cdn-lfs.hf.co", "db"]),
        min_size=1,
        max_size=3,
        unique=True,
    ),
)
sysctls = st.lists(
    st.builds(
        lambda name, value: {"name": name, "value": value},
        st.sampled_from(["net.ipv4.ip_unprivileged_port_start", "net.ipv4.ping_group_range"]),
        st.sampled_from(["0", "80", "443", "1024", "0 2147483647"]),
    ),
    max_size=2,
    unique_by=lambda s: s["name"],
)


@st.composite
def containers(
    draw: st.DrawFn, volumes: list[dict[str, Any]], count: int, init: bool
) -> list[dict[str, Any]]:
    result = []
    for _ in range(count):
        container: dict[str, Any] = {"name": "", "image": "busybox"}
        env = draw(st.lists(env_entry, max_size=5, unique_by=lambda e: e["name"]))
        if env:
            container["env"] = env
        if volumes:
            paths = draw(st.lists(mount_path, max_size=4, unique=True))
            mounts = []
            for path in paths:
                mount: dict[str, Any] = {
                    "name": draw(st.sampled_from(volumes))["name"],
                    "mountPath": path,
                }
                if draw(st.booleans()):
                    mount["readOnly"] = True
                if draw(st.booleans()):
                    mount["subPath"] = "x.pem"
                mounts.append(mount)
            if mounts:
                container["volumeMounts"] = mounts
        if init and draw(st.booleans()):
            container["restartPolicy"] = "Always"
        if draw(st.integers(0, 4)) == 0:
            container["securityContext"] = {"runAsUser": draw(st.sampled_from([0, 1000, 65532]))}
        result.append(container)
    return result


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    volumes = draw(st.lists(volume, max_size=4, unique_by=lambda v: v["name"]))
    regular = draw(containers(volumes, draw(st.integers(1, 3)), init=False))
    init = draw(containers(volumes, draw(st.integers(0, 2)), init=True))
    # Unique container names across both lists, some of them ours.
    pool = draw(
        st.lists(
            st.one_of(label, st.sampled_from(list(names.OWN_CONTAINERS))),
            min_size=len(regular) + len(init),
            max_size=len(regular) + len(init),
            unique=True,
        )
    )
    for container, name in zip(regular + init, pool, strict=True):
        container["name"] = name
    spec: dict[str, Any] = {"containers": regular}
    if init:
        spec["initContainers"] = init
    if volumes:
        spec["volumes"] = volumes
    if draw(st.booleans()):
        spec["hostNetwork"] = draw(st.booleans())
    if draw(st.integers(0, 9)) == 0:
        spec["os"] = {"name": "windows"}
    if draw(st.booleans()):
        spec["hostAliases"] = draw(st.lists(host_alias, max_size=3))
    if draw(st.booleans()):
        spec["securityContext"] = {"sysctls": draw(sysctls)}
    metadata: dict[str, Any] = draw(
        st.one_of(
            st.builds(lambda n: {"name": n}, label),
            st.builds(lambda n: {"generateName": n + "-"}, label),
        )
    )
    found = draw(annotations)
    if found:
        metadata["annotations"] = found
    if draw(st.booleans()):
        metadata["labels"] = {names.INJECT: draw(st.sampled_from(["true", "false"]))}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def own_mounts_only(pod: dict[str, Any], volume: str) -> bool:
    spec = pod["spec"]
    for container in (spec.get("initContainers") or []) + spec["containers"]:
        if container["name"] not in names.OWN_CONTAINERS:
            if volume in {m["name"] for m in container.get("volumeMounts") or []}:
                return False
    return True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pods(), config=st.sampled_from(CONFIGS))
def test_any_pod_is_answered_with_a_valid_patch(
    pod: dict[str, Any], config: InjectorSettings
) -> None:
    response = review.answer(admission_review(pod), config).review["response"]
    assert response["allowed"] is True, response
    patched = apply(pod, decoded_patch(response))
    check_pod(patched)
    again = review.answer(admission_review(patched), config).review["response"]
    assert decoded_patch(again) == []

    once = mutate(pod, config).pod
    check_pod(once)
    assert mutate(once, config).pod == once
    sidecar = next(c for c in once["spec"].get("initContainers", []) + once["spec"]["containers"]
                   if c["name"] == names.CONTAINER)  # fmt: skip
    ca = next(m["name"] for m in sidecar["volumeMounts"] if m["mountPath"] == names.CA_DIR)
    assert own_mounts_only(once, ca)


# -- the server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def webhook(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    directory = tmp_path_factory.mktemp("fuzz-webhook")
    write_pair(ca, directory)
    server = start_webhook(directory)
    yield server
    assert server.stop() == 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
review_like = st.builds(
    lambda uid, kind, operation, obj: {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": kind,
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "object": obj,
        },
    },
    st.one_of(st.text(min_size=1, max_size=8), json_values),
    st.one_of(st.just({"group": "", "version": "v1", "kind": "Pod"}), json_values),
    st.sampled_from(["CREATE", "UPDATE", None]),
    st.one_of(pods(), json_values, st.builds(lambda s: {"spec": s}, json_values)),
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    review_like.map(lambda v: json.dumps(v).encode()),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=bodies,
    content_type=st.sampled_from(
        ["application/json", "application/json; charset=utf-8", "text/plain", ""]
    ),
)
def test_the_server_never_answers_500(
    webhook: Webhook, ca: trustme.CA, body: bytes, content_type: str
) -> None:
    connection = webhook.connection(ca)
    try:
        connection.request("POST", "/mutate", body=body, headers={"Content-Type": content_type})
        response = connection.getresponse()
        status, payload = response.status, response.read()
    finally:
        connection.close()
    assert status in (200, 400, 415), (status, payload)
    if status == 200:
        answer = json.loads(payload)["response"]
        assert answer["uid"] == json.loads(body)["request"]["uid"]
        assert isinstance(answer["allowed"], bool)
        if answer["allowed"] and "patch" in answer:
            assert isinstance(decoded_patch(answer), list)


# -- malformed pods: render names the field, the webhook refuses them, nothing breaks -------

# Objects whose keys are data, not field names: their paths read `labels[key]`.
MAPS = {"labels", "annotations"}
# What the injector copies but never reads (see injector/shape.py): inside an env var's
# valueFrom and a volume's source, anything goes until the API server looks.
UNREAD = re.compile(r"\.valueFrom\.|^spec\.volumes\[\d+\]\.(?!name$)")
NOUNS = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "true or false",
    int: "an integer",
}
# Values of every other JSON type, for a node of each type.
WRONG: dict[type, list[Any]] = {
    dict: [5, "x", [], True],
    list: [5, "x", {}, False],
    str: [5, 1.5, [], {}, True],
    bool: ["true", 1, [], {}],
    int: ["65532", 1.5, True, [], {}],
}
# Fields the API server requires, by the path of their object with the indices left out.
REQUIRED = {
    "": ("spec",),
    "spec": ("containers",),
    "spec.containers[]": ("name",),
    "spec.initContainers[]": ("name",),
    "spec.containers[].env[]": ("name",),
    "spec.initContainers[].env[]": ("name",),
    "spec.containers[].volumeMounts[]": ("name", "mountPath"),
    "spec.initContainers[].volumeMounts[]": ("name", "mountPath"),
    "spec.volumes[]": ("name",),
    "spec.securityContext.sysctls[]": ("name", "value"),
}
Steps = tuple[str | int, ...]


def nodes(value: Any, path: str = "", steps: Steps = ()) -> Iterator[tuple[Steps, str, Any]]:
    """Every node below `value`: the keys and indices to it, its path as messages write
    it, and its value; parents before their children."""
    if isinstance(value, dict):
        for key, child in value.items():
            if steps and steps[-1] in MAPS:
                where = f"{path}[{key}]"
            else:
                where = f"{path}.{key}" if path else key
            yield (*steps, key), where, child
            yield from nodes(child, where, (*steps, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield (*steps, i), f"{path}[{i}]", child
            yield from nodes(child, f"{path}[{i}]", (*steps, i))


def changed(pod: dict[str, Any], steps: Steps, value: Any = None) -> dict[str, Any]:
    """A copy of `pod` with the node at `steps` replaced by `value`, or removed if None."""
    copied = copy.deepcopy(pod)
    parent: Any = copied
    for step in steps[:-1]:
        parent = parent[step]
    if value is None:
        del parent[steps[-1]]
    else:
        parent[steps[-1]] = value
    return copied


@st.composite
def malformed(draw: st.DrawFn) -> tuple[dict[str, Any], Steps, str]:
    """A generated pod with one field of a wrong type, or one required field missing, at
    any depth; with the steps to it and the problem the injector must name."""
    pod = draw(pods())
    typed = [n for n in nodes(pod) if type(n[2]) in NOUNS and not UNREAD.search(n[1])]
    missing = [
        ((*steps, key), f"{path}.{key}" if path else key)
        for steps, path, value in [((), "", pod), *nodes(pod)]
        if isinstance(value, dict)
        for key in REQUIRED.get(re.sub(r"\[\d+\]", "[]", path), ())
        if key in value
    ]
    if missing and draw(st.integers(0, 4)) == 0:
        steps, path = draw(st.sampled_from(missing))
        return changed(pod, steps), steps, f"{path}: required"
    # Every depth as likely as any other: deep nodes outnumber the shallow ones.
    depth = draw(st.sampled_from(sorted({len(steps) for steps, _, _ in typed})))
    steps, path, value = draw(st.sampled_from([n for n in typed if len(n[0]) == depth]))
    wrong = draw(st.sampled_from(WRONG[type(value)]))
    return changed(pod, steps, wrong), steps, f"{path}: expected {NOUNS[type(value)]}"


SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}}


def wrapped(pod: dict[str, Any], steps: Steps, wrapper: str) -> tuple[dict[str, Any], str]:
    """The pod as a Pod, a Deployment's template or a List's item; and the prefix of its
    paths in that document."""
    if wrapper == "Deployment" and steps[0] in ("metadata", "spec"):
        template = {key: pod[key] for key in ("metadata", "spec") if key in pod}
        spec = {"selector": {"matchLabels": {"app": "a"}}, "template": template}
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": spec}
        return deployment, "spec.template."
    if wrapper == "List":
        return {"apiVersion": "v1", "kind": "List", "items": [SERVICE, pod]}, "items[1]."
    return pod, ""


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=malformed(), wrapper=st.sampled_from(["Pod", "Deployment", "List"]))
def test_a_malformed_pod_is_named_by_render_and_refused_by_the_webhook(
    case: tuple[dict[str, Any], Steps, str], wrapper: str
) -> None:
    pod, steps, problem = case
    document, prefix = wrapped(pod, steps, wrapper)
    assert render_in_process(stdin=json.dumps(document)) == (2, "", f"error: {prefix}{problem}\n")
    answer = review.answer(admission_review(pod), InjectorSettings())
    assert answer.outcome == review.MALFORMED
    assert answer.review["response"]["allowed"] is False
    assert answer.review["response"]["status"] == {
        "code": 400,
        "message": f"burstbuffer injector: malformed pod: {problem}",
    }


@st.composite
def damaged(draw: st.DrawFn) -> dict[str, Any]:
    """A generated pod with any one node, read by the injector or not, replaced by any
    JSON value (of the same type or not)."""
    pod = draw(pods())
    steps = draw(st.sampled_from([steps for steps, _, _ in nodes(pod)]))
    return changed(pod, steps, draw(json_values.filter(lambda v: v is not None)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=damaged())
def test_a_damaged_pod_is_rendered_or_named_never_a_crash(pod: dict[str, Any]) -> None:
    status, out, err = render_in_process(stdin=json.dumps(pod))
    if status == 2:
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    else:
        assert status == 0, err
        assert isinstance(yaml.safe_load(out), dict)
        assert all(": " in line for line in err.splitlines()), err
    response = review.answer(admission_review(pod), InjectorSettings()).review["response"]
    assert response["allowed"] is True or response["status"]["code"] == 400, response
    if (pod.get("apiVersion"), pod.get("kind")) == ("v1", "Pod"):
        # Still a Pod to render (a changed kind may make it something else): both agree.
        assert (status == 2) == (response["allowed"] is False)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=malformed())
def test_the_server_refuses_malformed_pods_with_the_field(
    webhook: Webhook, ca: trustme.CA, case: tuple[dict[str, Any], Steps, str]
) -> None:
    pod, _, problem = case
    response = webhook.review(ca, admission_review(pod))  # asserts a 200 and the uid
    assert response["allowed"] is False
    assert response["status"]["message"] == f"burstbuffer injector: malformed pod: {problem}"
