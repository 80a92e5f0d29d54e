"""The MutatingWebhookConfiguration: which pods it sends, how, and the TLS it trusts.

Selection is checked by evaluating the rendered selectors the way the API server does,
over a matrix of namespaces and pod labels. TLS is checked with a real handshake that
trusts only the rendered caBundle and uses the name the API server uses for a Service
(`<service>.<namespace>.svc`). Certificate reuse across upgrades runs the chart's
`lookup` against a minimal API server holding the Secret of the first install.
"""

from __future__ import annotations

import base64
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
from fakekube import fake_cluster
from helmchart import (
    INJECTOR,
    NAMESPACE,
    SCENARIOS,
    of_kind,
    one,
    pod_template,
    render,
    secret_data,
    webhooks_calling,
)

NAMESPACE_ENTRY = "namespace.inject.burstbuffer.io"
OBJECT_ENTRY = "object.inject.burstbuffer.io"
ENABLED = {"burstbuffer.io/inject": "enabled"}
POD_IN = {"burstbuffer.io/inject": "true"}
POD_OUT = {"burstbuffer.io/inject": "false"}
APP = {"app": "train"}


@pytest.fixture(scope="module")
def default_documents() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def webhook(default_documents: list[dict[str, Any]]) -> dict[str, Any]:
    return one(default_documents, "MutatingWebhookConfiguration")


@pytest.mark.parametrize(
    ("namespace", "namespace_labels", "pod_labels", "expected"),
    [
        # An enabled namespace: every pod, once, unless it opts out.
        ("ml", ENABLED, APP, [NAMESPACE_ENTRY]),
        ("ml", ENABLED, {**APP, **POD_IN}, [NAMESPACE_ENTRY]),
        ("ml", ENABLED, {**APP, **POD_OUT}, []),
        # Elsewhere: only pods that opt in.
        ("default", {}, APP, []),
        ("default", {}, {**APP, **POD_IN}, [OBJECT_ENTRY]),
        ("default", {}, {**APP, **POD_OUT}, []),
        ("other", {"burstbuffer.io/inject": "something-else"}, POD_IN, [OBJECT_ENTRY]),
        # Never kube-system nor the release namespace, whatever their labels say.
        ("kube-system", ENABLED, APP, []),
        ("kube-system", {}, POD_IN, []),
        (NAMESPACE, ENABLED, APP, []),
        (NAMESPACE, {}, POD_IN, []),
    ],
)
def test_which_pods_are_sent(
    webhook: dict[str, Any],
    namespace: str,
    namespace_labels: dict[str, str],
    pod_labels: dict[str, str],
    expected: list[str],
) -> None:
    assert webhooks_calling(webhook, namespace, namespace_labels, pod_labels) == expected


@pytest.mark.parametrize("namespace_labels", [{}, ENABLED])
def test_injector_pods_are_never_sent(
    default_documents: list[dict[str, Any]],
    webhook: dict[str, Any],
    namespace_labels: dict[str, str],
) -> None:
    # Even if someone labels a namespace holding an injector: its pods opt out by label.
    labels = pod_template(default_documents)["metadata"]["labels"]
    assert webhooks_calling(webhook, "elsewhere", namespace_labels, labels) == []


def test_release_namespace_follows_the_release() -> None:
    configuration = one(render(namespace="platform"), "MutatingWebhookConfiguration")
    assert webhooks_calling(configuration, "platform", ENABLED, APP) == []
    assert webhooks_calling(configuration, NAMESPACE, ENABLED, APP) == [NAMESPACE_ENTRY]


def test_entries_call_the_injector_service_for_pod_creation(
    default_documents: list[dict[str, Any]], webhook: dict[str, Any]
) -> None:
    service = one(default_documents, "Service")
    assert [hook["name"] for hook in webhook["webhooks"]] == [NAMESPACE_ENTRY, OBJECT_ENTRY]
    for hook in webhook["webhooks"]:
        assert hook["clientConfig"]["service"] == {
            "name": service["metadata"]["name"],
            "namespace": NAMESPACE,
            "path": "/mutate",
            "port": service["spec"]["ports"][0]["port"],
        }
        assert hook["rules"] == [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["sideEffects"] == "None"
        assert hook["failurePolicy"] == "Ignore"
        assert hook["reinvocationPolicy"] == "Never"
        assert hook["timeoutSeconds"] == 10


def test_policies_come_from_values() -> None:
    values = {
        "webhook": {"failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded", "timeoutSeconds": 3}
    }
    for hook in one(render(values), "MutatingWebhookConfiguration")["webhooks"]:
        assert (hook["failurePolicy"], hook["reinvocationPolicy"], hook["timeoutSeconds"]) == (
            "Fail",
            "IfNeeded",
            3,
        )


# --- TLS ---------------------------------------------------------------------------------


def _handshake(data: dict[str, bytes], ca_bundle: bytes, server_name: str, tmp_path: Path) -> None:
    """A real TLS handshake: a server with the Secret's pair, a client trusting `ca_bundle`.

    Raises ssl.SSLCertVerificationError when the client does not accept the server.
    """
    (tmp_path / "tls.crt").write_bytes(data["tls.crt"])
    (tmp_path / "tls.key").write_bytes(data["tls.key"])
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client_context = ssl.create_default_context(cadata=ca_bundle.decode())
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)

        def serve() -> None:
            connection, _ = listener.accept()
            connection.settimeout(10)
            try:
                with server_context.wrap_socket(connection, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass  # the client refused us: its side raises, which is what is checked

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=10) as raw:
                with client_context.wrap_socket(raw, server_hostname=server_name) as tls:
                    tls.sendall(b"x")
        finally:
            thread.join(timeout=10)


def _tls(documents: list[dict[str, Any]]) -> tuple[dict[str, bytes], list[bytes]]:
    """The Secret's data and every webhook entry's decoded caBundle."""
    data = secret_data(one(documents, "Secret"))
    hooks = one(documents, "MutatingWebhookConfiguration")["webhooks"]
    return data, [base64.b64decode(hook["clientConfig"]["caBundle"]) for hook in hooks]


def test_generated_certificate_is_trusted_by_the_api_server(
    default_documents: list[dict[str, Any]], tmp_path: Path
) -> None:
    data, bundles = _tls(default_documents)
    assert bundles == [data["ca.crt"], data["ca.crt"]]
    secret = one(default_documents, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    _handshake(data, data["ca.crt"], f"{INJECTOR}.{NAMESPACE}.svc", tmp_path)


def test_generated_certificate_is_refused_by_a_stranger_or_for_another_name(
    default_documents: list[dict[str, Any]], tmp_path: Path
) -> None:
    data, _ = _tls(default_documents)
    other_install, _ = _tls(render())
    assert other_install["ca.crt"] != data["ca.crt"]
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(data, other_install["ca.crt"], f"{INJECTOR}.{NAMESPACE}.svc", tmp_path)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(data, data["ca.crt"], f"{INJECTOR}.elsewhere.svc", tmp_path)


def test_upgrade_keeps_the_certificate(default_documents: list[dict[str, Any]]) -> None:
    installed = one(default_documents, "Secret")
    name = installed["metadata"]["name"]
    with fake_cluster() as (server, config):
        server.put(installed)
        upgraded = render(config=config, upgrade=True)
        assert f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}" in server.requests
    data, bundles = _tls(upgraded)
    assert data == secret_data(installed)
    assert bundles == [data["ca.crt"], data["ca.crt"]]


@pytest.mark.parametrize("existing", ["absent", "incomplete"])
def test_upgrade_without_a_usable_secret_makes_a_new_pair(
    default_documents: list[dict[str, Any]], existing: str
) -> None:
    installed = one(default_documents, "Secret")
    with fake_cluster() as (server, config):
        if existing == "incomplete":
            incomplete = {**installed, "data": {"tls.crt": installed["data"]["tls.crt"]}}
            server.put(incomplete)
        data, bundles = _tls(render(config=config, upgrade=True))
    assert data["ca.crt"] != secret_data(installed)["ca.crt"]
    assert bundles == [data["ca.crt"], data["ca.crt"]]


def test_cert_manager_issues_and_injects_the_ca() -> None:
    documents = render(SCENARIOS["cert-manager"])
    assert not of_kind(documents, "Secret")
    configuration = one(documents, "MutatingWebhookConfiguration")
    for hook in configuration["webhooks"]:
        assert "caBundle" not in hook["clientConfig"]
    certificate = one(documents, "Certificate", INJECTOR)
    annotation = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert annotation == f"{NAMESPACE}/{certificate['metadata']['name']}"
    assert f"{INJECTOR}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    volumes = {v["name"]: v for v in pod_template(documents)["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    # The chart's own CA: selfSigned Issuer -> CA Certificate -> CA Issuer -> serving cert.
    ca_issuer = one(documents, "Issuer", certificate["spec"]["issuerRef"]["name"])
    ca_certificate = one(documents, "Certificate", f"{INJECTOR}-ca")
    assert ca_certificate["spec"]["isCA"] is True
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_certificate["spec"]["secretName"]
    self_signed = one(documents, "Issuer", ca_certificate["spec"]["issuerRef"]["name"])
    assert self_signed["spec"] == {"selfSigned": {}}


def test_cert_manager_with_an_issuer_of_your_own() -> None:
    documents = render(SCENARIOS["cert-manager-cluster-issuer"])
    assert not of_kind(documents, "Issuer")
    (certificate,) = of_kind(documents, "Certificate")
    assert certificate["spec"]["issuerRef"] == {
        "name": "corporate-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    assert (certificate["spec"]["duration"], certificate["spec"]["renewBefore"]) == ("720h", "240h")
