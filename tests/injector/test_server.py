"""`burstbuffer-injector serve` over real TLS, and `render`, as processes."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from podcheck import admission_review, apply, check_pod, decoded_patch
from webhook import INJECTOR, Webhook, start_webhook, write_pair

from injector.server import MAX_BODY

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"generateName": "train-", "namespace": "ml"},
    "spec": {"containers": [{"name": "train", "image": "python:3.12"}]},
}


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def webhook(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    directory = tmp_path_factory.mktemp("webhook")
    write_pair(ca, directory)
    server = start_webhook(directory)
    yield server
    assert server.stop() == 0


def test_a_pod_is_injected_over_tls(webhook: Webhook, ca: trustme.CA) -> None:
    response = webhook.review(ca, admission_review(POD, namespace="ml"))
    assert response["allowed"] is True
    patched = apply(POD, decoded_patch(response))
    check_pod(patched)
    assert [c["name"] for c in patched["spec"]["initContainers"]] == ["burstbuffer"]
    assert "warnings" not in response
    assert "injector.review: pod ml/train-*: injected" in webhook.log.read_text()


def test_skips_and_other_requests_get_no_patch(webhook: Webhook, ca: trustme.CA) -> None:
    host_network = {**POD, "spec": {**POD["spec"], "hostNetwork": True}}
    response = webhook.review(ca, admission_review(host_network))
    assert response == {"uid": response["uid"], "allowed": True}
    assert "skipped (host-network)" in webhook.log.read_text()

    update = admission_review(POD, operation="UPDATE")
    assert "patch" not in webhook.review(ca, update)
    service = admission_review(POD)
    service["request"]["kind"] = {"group": "", "version": "v1", "kind": "Service"}
    assert "patch" not in webhook.review(ca, service)


def test_warnings_reach_the_user(webhook: Webhook, ca: trustme.CA) -> None:
    pod = {**POD, "metadata": {"name": "p", "annotations": {"burstbuffer.io/buffer-size": "lots"}}}
    response = webhook.review(ca, admission_review(pod))
    assert response["warnings"] == [
        "burstbuffer: burstbuffer.io/buffer-size: invalid quantity 'lots': expected e.g. "
        "128Mi, 1G or 500m; using the default"
    ]


def test_a_malformed_pod_is_refused_naming_the_field(webhook: Webhook, ca: trustme.CA) -> None:
    broken = {**POD, "spec": {"containers": "not a list"}}
    response = webhook.review(ca, admission_review(broken))
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 400,
        "message": "burstbuffer injector: malformed pod: spec.containers: expected a list",
    }
    assert "patch" not in response
    assert "pod default/train-*: refused, malformed: spec.containers" in webhook.log.read_text()


@pytest.mark.parametrize(
    ("method", "path", "body", "content_type", "status"),
    [
        ("POST", "/mutate", b"{}", "text/plain", 415),
        ("POST", "/mutate", b"{not json", "application/json", 400),
        ("POST", "/mutate", b"[1, 2]", "application/json", 400),
        ("POST", "/mutate", b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",'
                            b' "request": {"uid": "u"}}', "application/json", 400),
        ("POST", "/mutate", json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}
        ).encode(), "application/json", 400),
        ("POST", "/mutate", b"[" * 100_000, "application/json", 400),
        ("POST", "/mutate", b" " * (MAX_BODY + 1), "application/json", 413),
        ("GET", "/mutate", None, "", 405),
        ("GET", "/nothing", None, "", 404),
    ],
)  # fmt: skip
def test_bad_requests(
    webhook: Webhook,
    ca: trustme.CA,
    method: str,
    path: str,
    body: bytes | None,
    content_type: str,
    status: int,
) -> None:
    assert webhook.request(ca, method, path, body, content_type)[0] == status


def test_healthz_and_metrics(webhook: Webhook, ca: trustme.CA) -> None:
    assert webhook.request(ca, "GET", "/healthz") == (200, b"ok\n")
    webhook.review(ca, admission_review(POD))
    opted_out = {**POD, "metadata": {"labels": {"burstbuffer.io/inject": "false"}}}
    webhook.review(ca, admission_review(opted_out))
    webhook.request(ca, "POST", "/mutate", b"{}", "text/plain")
    status, body = webhook.request(ca, "GET", "/metrics")
    assert status == 200
    samples = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    assert samples["burstbuffer_injector_reviews_total"] >= 2
    assert samples["burstbuffer_injector_injected_total"] >= 1
    assert samples['burstbuffer_injector_skipped_total{reason="opted-out"}'] >= 1
    assert samples['burstbuffer_injector_bad_requests_total{code="415"}'] >= 1
    assert samples["burstbuffer_injector_review_seconds_count"] >= 2


def test_tls_is_1_2_or_newer(webhook: Webhook, ca: trustme.CA) -> None:
    context = webhook.context(ca)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    connection = webhook.connection(ca, context)
    connection.request("GET", "/healthz")
    assert connection.getresponse().status == 200
    assert connection.sock is not None and connection.sock.version() == "TLSv1.2"
    connection.close()

    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(old)
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # deliberately old
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError):
        connection = webhook.connection(ca, old)
        connection.request("GET", "/healthz")


def served_by(webhook: Webhook, ca: trustme.CA) -> bool:
    """True if a new connection verifies against `ca`."""
    try:
        return webhook.request(ca, "GET", "/healthz")[0] == 200
    except ssl.SSLCertVerificationError:
        return False


def test_rotated_certificates_are_picked_up_without_restart(tmp_path: Path) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    write_pair(old_ca, tmp_path)
    server = start_webhook(tmp_path)
    try:
        assert served_by(server, old_ca) and not served_by(server, new_ca)
        # Half a rotation (new certificate, old key) keeps the old pair in use...
        write_pair(new_ca, tmp_path, key_name="ignored.key")
        assert served_by(server, old_ca)
        assert "TLS certificate not reloaded" in server.log.read_text()
        # ...and the whole of it switches new connections to the new pair.
        write_pair(new_ca, tmp_path)
        assert served_by(server, new_ca) and not served_by(server, old_ca)
        assert "TLS certificate reloaded" in server.log.read_text()
    finally:
        assert server.stop() == 0


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(INJECTOR), *args], input=stdin, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("capture: iptables\n", "capture: expected one of proxy-env, hostAliases, transparent"),
        ("buffer: {size: 1Gi, medum: Disk}\n", "buffer.medum: unknown key"),
    ],
)
def test_serve_refuses_a_bad_configuration_at_start(
    tmp_path: Path, ca: trustme.CA, config: str, message: str
) -> None:
    write_pair(ca, tmp_path)
    (tmp_path / "config.yaml").write_text(config)
    started = time.monotonic()
    pair = ["--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key")]
    done = run("serve", "--port", "0", *pair, "--config", str(tmp_path / "config.yaml"))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert time.monotonic() - started < 30


def test_serve_without_its_certificate_says_so(tmp_path: Path) -> None:
    done = run("serve", "--port", "0", "--tls-cert", str(tmp_path / "missing.crt"),
               "--tls-key", str(tmp_path / "missing.key"))  # fmt: skip
    assert done.returncode == 1 and "missing.crt" in done.stderr


def test_render_takes_json_or_yaml_and_matches_the_webhook(
    webhook: Webhook, ca: trustme.CA
) -> None:
    from_json = run("render", stdin=json.dumps(POD))
    from_yaml = run("render", "--namespace", "ml", stdin=yaml.safe_dump(POD))
    assert from_json.returncode == from_yaml.returncode == 0, from_json.stderr
    rendered = yaml.safe_load(from_json.stdout)
    assert yaml.safe_load(from_yaml.stdout) == rendered
    assert "&id" not in from_json.stdout  # plain YAML, no anchors
    response = webhook.review(ca, admission_review(POD))
    assert apply(POD, decoded_patch(response)) == rendered


def test_render_explains_skips_and_refuses_what_it_cannot_read() -> None:
    opted_out: dict[str, Any] = {
        **POD,
        "metadata": {"annotations": {"burstbuffer.io/inject": "false"}},
    }
    done = run("render", stdin=yaml.safe_dump(opted_out))
    assert done.returncode == 0 and yaml.safe_load(done.stdout) == opted_out
    assert done.stderr == (
        "pod/<unnamed>: not injected: the pod sets burstbuffer.io/inject=false "
        "(label or annotation)\n"
    )
    for text, error in (
        ("kind: Deployment\napiVersion: apps/v1\nspec: {}\n", "spec.template: required"),
        ("- a\n- b\n", "expected an object (a Kubernetes manifest)"),
        ("a: [\n", "not YAML or JSON: line 2, column 1: expected the node content, but "
                   "found '<stream end>'"),
    ):  # fmt: skip
        done = run("render", stdin=text)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {error}\n")
