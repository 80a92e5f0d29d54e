"""A second call for an injected pod (`reinvocationPolicy: IfNeeded`, after another webhook
changed it), through the webhook's answer: the containers added since are wired to the
sidecar the pod has, ours go back in their places, and nothing else of ours changes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from podcheck import admission_review, apply, check_pod, decoded_patch

from injector import names, review, settings
from injector.mutate import TRUST_VARIABLES, mutate, rewire

OWN_PROXY = "http://127.0.0.1:3128"
BUNDLE = "/etc/burstbuffer/trust/ca-bundle.crt"
# What the API server's defaulting adds to a container between two webhooks.
DEFAULTED = {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}


def app_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train"},
        "spec": {"containers": [{"name": "app", "image": "debian:bookworm"}]},
    }


def stored(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the next webhook gets it: every container defaulted."""
    pod = copy.deepcopy(pod)
    for key in ("initContainers", "containers"):
        pod["spec"][key] = [{**DEFAULTED, **c} for c in pod["spec"].get(key) or []]
    return pod


def another_webhook(pod: dict[str, Any], **env: str) -> dict[str, Any]:
    """What a later webhook does: an init container in front, a container at the end."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    variables = [{"name": k, "value": v} for k, v in env.items()]
    spec["initContainers"] = [
        {"name": "extra-init", "image": "debian:bookworm", "env": variables},
        *(spec.get("initContainers") or []),
    ]
    spec["containers"] = [*spec["containers"], {"name": "extra", "image": "debian:bookworm"}]
    return pod


def reinvoked(pod: dict[str, Any], config: settings.InjectorSettings) -> dict[str, Any]:
    """The webhook's first answer, another webhook's change, the webhook's second answer:
    the pod the API server stores; also checks that a third call changes nothing."""
    first = review.answer(admission_review(pod), config).review["response"]
    once = stored(apply(pod, decoded_patch(first)))
    changed = stored(another_webhook(once))
    response = review.answer(admission_review(changed), config).review["response"]
    assert response["allowed"] is True
    after = apply(changed, decoded_patch(response))
    check_pod(after)
    again = review.answer(admission_review(after), config).review["response"]
    assert decoded_patch(again) == []
    return after


def by_name(pod: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["spec"].get(key) or []}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def trusts_the_pod_ca(container: dict[str, Any]) -> bool:
    env = env_of(container)
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts") or []}
    return all(env.get(v) == BUNDLE for v in TRUST_VARIABLES) and (
        mounts.get("/etc/burstbuffer/trust") == names.TRUST_VOLUME
    )


def test_containers_added_after_a_native_injection_are_wired_and_the_sidecar_goes_first() -> None:
    after = reinvoked(app_pod(), settings.InjectorSettings())
    init, regular = by_name(after, "initContainers"), by_name(after, "containers")
    assert list(init) == [names.CONTAINER, "extra-init"]
    assert list(regular) == ["app", "extra"]
    for container in (init["extra-init"], regular["extra"], regular["app"]):
        assert trusts_the_pod_ca(container)
        # A native sidecar is up before every init container: all are proxied.
        assert env_of(container)["https_proxy"] == OWN_PROXY
    # Ours as the API server stored it: its defaults are not patched away.
    assert init[names.CONTAINER]["terminationMessagePath"] == DEFAULTED["terminationMessagePath"]


def test_containers_added_after_a_classic_injection_keep_the_classic_order() -> None:
    config = settings.load("nativeSidecar: false")
    after = reinvoked(app_pod(), config)
    init, regular = by_name(after, "initContainers"), by_name(after, "containers")
    # The primer first (the added init container mounts the bundle it writes), the
    # sidecar first of the containers.
    assert list(init) == [names.INIT_CONTAINER, "extra-init"]
    assert list(regular) == [names.CONTAINER, "app", "extra"]
    assert trusts_the_pod_ca(init["extra-init"]) and trusts_the_pod_ca(regular["extra"])
    # Init containers run before a classic sidecar: trust, no proxy.
    assert "https_proxy" not in env_of(init["extra-init"])
    assert env_of(regular["extra"])["https_proxy"] == OWN_PROXY


def test_the_recorded_capture_mode_and_proxy_port_are_the_ones_used() -> None:
    # A pod injected with hostAliases on port 3300, called again by an injector
    # configured otherwise: the added containers are wired to the sidecar the pod has.
    injected = mutate(app_pod(), settings.load("capture: hostAliases\nproxyPort: 3300")).pod
    changed = another_webhook(injected, https_proxy="http://corp-proxy:8080")
    result = rewire(changed, settings.InjectorSettings())
    assert result is not None
    init = by_name(result.pod, "initContainers")
    # hostAliases: only a container naming a proxy is pointed at the sidecar.
    assert env_of(init["extra-init"])["https_proxy"] == "http://127.0.0.1:3300"
    assert "https_proxy" not in env_of(by_name(result.pod, "containers")["extra"])
    assert any("corp-proxy:8080" in w for w in result.warnings), result.warnings


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["metadata"]["annotations"].pop(names.STATUS),
        lambda p: p["metadata"]["annotations"].update({names.STATUS: "{not json"}),
        lambda p: p["spec"]["initContainers"][0].update(volumeMounts=[]),
    ],
)
def test_a_pod_whose_injection_cannot_be_read_is_left_alone(change: Any) -> None:
    injected = mutate(app_pod(), settings.InjectorSettings()).pod
    change(injected)
    assert rewire(injected, settings.InjectorSettings()) is None
    changed = another_webhook(injected)
    response = review.answer(admission_review(changed), settings.InjectorSettings())
    assert decoded_patch(response.review["response"]) == []


def test_a_container_named_like_ours_is_no_sidecar_to_wire_to() -> None:
    pod = app_pod()
    pod["spec"]["containers"].append({"name": names.CONTAINER, "image": "x"})
    assert rewire(pod, settings.InjectorSettings()) is None
