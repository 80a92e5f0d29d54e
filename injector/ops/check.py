"""`burstbuffer check`: is the injector installed, trusted, and injecting this namespace?

Five checks, each one line, pass or fail with the fix (as `linkerd check` does):
the injector Deployment ready; the MutatingWebhookConfiguration present and calling
the injector's Service; its caBundle verifying the serving certificate the injector
presents (the Secret its Deployment mounts), with the days until that certificate or
its CA expires; the namespace's opt-in label; and a server-side dry run of a pod in the
namespace, which goes through admission and comes back injected or not.

The verdicts are pure functions of what the API server answered (an object, or the
`ApiError` it sent instead); `run` fetches, decides, prints.
"""

from __future__ import annotations

import base64
import datetime
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from cryptography import x509
from cryptography.x509.verification import (
    Criticality,
    ExtensionPolicy,
    PolicyBuilder,
    Store,
    VerificationError,
)

from injector import names
from injector.ops import output
from injector.ops.kube import ApiError, Kube

# What the API server answered for one object: the object, or its error Status.
Answer = Mapping[str, Any] | ApiError

# The chart's names for `helm install burstbuffer charts/burstbuffer -n burstbuffer-system`.
DEFAULT_INJECTOR_NAMESPACE = "burstbuffer-system"
DEFAULT_INJECTOR_NAME = "burstbuffer-injector"
# The dry-run pod: a name prefix that says whose it is; nothing is ever stored or pulled.
PROBE_PREFIX = "burstbuffer-check-"
NAMESPACE_OPT_IN = "enabled"
# A CA certificate must say it is one, a serving certificate must carry its names (as Go
# requires: the name is matched against subjectAltName only); nothing else is demanded.
_CA_POLICY = ExtensionPolicy.permit_all().require_present(
    x509.BasicConstraints, Criticality.AGNOSTIC, None
)
_SERVING_POLICY = ExtensionPolicy.permit_all().require_present(
    x509.SubjectAlternativeName, Criticality.AGNOSTIC, None
)


@dataclass(frozen=True)
class Injector:
    """Where the injector lives: its Deployment, Service and webhook configuration share
    one name (the chart's `<release>-injector`)."""

    namespace: str
    name: str

    @property
    def service_host(self) -> str:
        """The name the API server verifies the injector's certificate for."""
        return f"{self.name}.{self.namespace}.svc"


@dataclass(frozen=True)
class Verdict:
    check: str  # what was checked
    ok: bool
    detail: str  # what was found
    fix: str | None = None  # what to do about a failure


def deployment_ready(injector: Injector, deployment: Answer) -> Verdict:
    check = f"injector Deployment {injector.namespace}/{injector.name} is ready"
    if isinstance(deployment, ApiError):
        permission = f"get deployments in namespace {injector.namespace}"
        return _failed(check, deployment, permission, _install_fix(injector))
    wanted = int(deployment.get("spec", {}).get("replicas", 1))
    ready = int(deployment.get("status", {}).get("readyReplicas") or 0)
    detail = f"{ready}/{wanted} replicas ready"
    if wanted > 0 and ready >= wanted:
        return Verdict(check, True, detail)
    fix = (
        f"kubectl -n {injector.namespace} describe deployment {injector.name}; "
        f"kubectl -n {injector.namespace} logs deployment/{injector.name}"
    )
    return Verdict(check, False, detail, fix)


def webhook_configured(injector: Injector, configuration: Answer) -> Verdict:
    check = f"MutatingWebhookConfiguration {injector.name} calls the injector"
    if isinstance(configuration, ApiError):
        permission = "get mutatingwebhookconfigurations"
        return _failed(check, configuration, permission, _install_fix(injector))
    hooks = configuration.get("webhooks") or []
    elsewhere = sorted(
        {_service(hook) for hook in hooks} - {f"{injector.namespace}/{injector.name}"}
    )
    if hooks and not elsewhere:
        return Verdict(check, True, f"{len(hooks)} webhooks, Service {_service(hooks[0])}")
    detail = f"webhooks call {', '.join(elsewhere)}" if hooks else "it has no webhooks"
    return Verdict(check, False, detail, _install_fix(injector))


def tls_secret_name(deployment: Answer) -> str | None:
    """The Secret holding the certificate the injector serves: the volume mounted where
    the injector's `--tls-cert` file is."""
    if isinstance(deployment, ApiError):
        return None
    spec = deployment.get("spec", {}).get("template", {}).get("spec", {})
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    for container in spec.get("containers") or []:
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if "--tls-cert" not in argv[:-1]:
            continue
        directory = posixpath.dirname(argv[argv.index("--tls-cert") + 1])
        for mount in container.get("volumeMounts") or []:
            if mount.get("mountPath", "").rstrip("/") == directory:
                secret = volumes.get(mount.get("name"), {}).get("secret", {})
                return secret.get("secretName")
    return None


def ca_bundle_trusts_certificate(
    injector: Injector,
    configuration: Answer,
    secret_name: str | None,
    secret: Answer | None,
    now: datetime.datetime,
) -> Verdict:
    """Every webhook's caBundle verifies the serving certificate for the Service's name,
    now, as the API server does when it calls the webhook."""
    check = "the webhook's caBundle trusts the injector's serving certificate"
    if isinstance(configuration, ApiError):
        return Verdict(check, False, "no webhook configuration to read", _install_fix(injector))
    if secret_name is None or secret is None:
        detail = "cannot tell which Secret the injector serves (its Deployment is unreadable)"
        return Verdict(check, False, detail, _install_fix(injector))
    where = f"Secret {injector.namespace}/{secret_name}"
    if isinstance(secret, ApiError):
        permission = f"get secrets in namespace {injector.namespace}"
        return _failed(check, secret, permission, _install_fix(injector))
    try:
        chain = x509.load_pem_x509_certificates(
            base64.b64decode((secret.get("data") or {})["tls.crt"])
        )
    except (KeyError, ValueError) as e:
        return Verdict(check, False, f"{where} has no usable tls.crt: {e}", _renew_fix(injector))
    expires = chain[0].not_valid_after_utc
    hooks = configuration.get("webhooks") or []
    if not hooks:
        return Verdict(check, False, "the configuration has no webhooks", _install_fix(injector))
    for hook in hooks:
        bundle = (hook.get("clientConfig") or {}).get("caBundle") or ""
        if not bundle:
            detail = f"webhook {hook.get('name')} has no caBundle"
            return Verdict(check, False, detail, _renew_fix(injector))
        try:
            roots = x509.load_pem_x509_certificates(base64.b64decode(bundle))
            verifier = (
                PolicyBuilder()
                # The API server (Go's crypto/x509) checks signatures, validity, the name
                # and the key usage for serving; not the Web PKI's rules on which
                # extensions are critical, which self-made CAs often break.
                .extension_policies(ca_policy=_CA_POLICY, ee_policy=_SERVING_POLICY)
                .store(Store(roots))
                .time(now)
                .build_server_verifier(x509.DNSName(injector.service_host))
            )
            path = verifier.verify(chain[0], chain[1:])
        except (ValueError, VerificationError) as e:
            detail = f"webhook {hook.get('name')}: its caBundle does not verify {where}: {e}"
            return Verdict(check, False, detail, _renew_fix(injector))
        expires = min(expires, *(c.not_valid_after_utc for c in path))
    days = (expires - now).days
    return Verdict(check, True, f"{where}; the certificate or its CA expires in {days} days")


def namespace_opted_in(namespace: str, found: Answer) -> Verdict:
    check = f"namespace {namespace} has the label {names.INJECT}={NAMESPACE_OPT_IN}"
    if isinstance(found, ApiError):
        fix = f"kubectl create namespace {namespace}" if found.code == 404 else None
        return _failed(check, found, "get namespaces", fix)
    label = (found.get("metadata", {}).get("labels") or {}).get(names.INJECT)
    if label == NAMESPACE_OPT_IN:
        return Verdict(check, True, "pods created here get the sidecar")
    detail = "no such label" if label is None else f"the label is {label!r}"
    fix = f"kubectl label namespace {namespace} {names.INJECT}={NAMESPACE_OPT_IN} --overwrite"
    return Verdict(check, False, detail, fix)


def probe_pod() -> dict[str, Any]:
    """The dry-run pod: small, and acceptable to the `restricted` Pod Security level."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": PROBE_PREFIX},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "probe",
                    "image": "registry.k8s.io/pause:3.10",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def dry_run_injected(injector: Injector, namespace: str, created: Answer) -> Verdict:
    check = f"a pod created in {namespace} is injected (server-side dry run)"
    logs = f"kubectl -n {injector.namespace} logs deployment/{injector.name}"
    if isinstance(created, ApiError):
        return _failed(check, created, f"create pods in namespace {namespace}", f"see {logs}")
    spec = created.get("spec", {})
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    sidecar = any(c.get("name") == names.CONTAINER for c in containers)
    annotated = names.STATUS in (created.get("metadata", {}).get("annotations") or {})
    if sidecar and annotated:
        return Verdict(check, True, f"it came back with the {names.CONTAINER} container")
    fix = (
        "fix the checks above; with failurePolicy Ignore an unreachable or untrusted "
        f"injector lets pods through uninjected: see {logs}"
    )
    return Verdict(check, False, "it came back without the sidecar", fix)


def _service(hook: Mapping[str, Any]) -> str:
    service = (hook.get("clientConfig") or {}).get("service") or {}
    if not service:
        return "a URL, not a Service"
    return f"{service.get('namespace')}/{service.get('name')}"


def _failed(check: str, error: ApiError, permission: str, fix: str | None) -> Verdict:
    """A check the API server answered with an error: refused (403) needs `permission`."""
    if error.code == 403:
        fix = f"the check needs RBAC permission to {permission}: ask your cluster admin"
    return Verdict(check, False, f"{error.code} {error.message}", fix)


def _install_fix(injector: Injector) -> str:
    return (
        f"helm upgrade --install burstbuffer charts/burstbuffer -n {injector.namespace} "
        "--create-namespace, or name the installed one with --injector-namespace and "
        "--injector-name"
    )


def _renew_fix(injector: Injector) -> str:
    return (
        "helm upgrade the release (it rewrites caBundle from the Secret), or with "
        f"cert-manager check its cainjector; then kubectl -n {injector.namespace} "
        f"rollout restart deployment/{injector.name}"
    )


def verdicts(
    kube: Kube, injector: Injector, namespace: str, now: datetime.datetime
) -> list[Verdict]:
    """Ask the API server, then decide every check."""

    def fetch(method: Any, *args: Any) -> Answer:
        try:
            answer: Mapping[str, Any] = method(*args)
        except ApiError as e:
            return e
        return answer

    deployment = fetch(kube.deployment, injector.namespace, injector.name)
    configuration = fetch(kube.mutating_webhook_configuration, injector.name)
    secret_name = tls_secret_name(deployment)
    secret = None if secret_name is None else fetch(kube.secret, injector.namespace, secret_name)
    return [
        deployment_ready(injector, deployment),
        webhook_configured(injector, configuration),
        ca_bundle_trusts_certificate(injector, configuration, secret_name, secret, now),
        namespace_opted_in(namespace, fetch(kube.namespace_object, namespace)),
        dry_run_injected(
            injector, namespace, fetch(kube.dry_run_create_pod, namespace, probe_pod())
        ),
    ]


def print_verdicts(results: Sequence[Verdict], output_format: str, out: TextIO) -> None:
    if output_format != "table":
        output.document({"checks": [asdict(v) for v in results]}, output_format, out)
        return
    for v in results:
        print(f"{'ok' if v.ok else 'FAIL':<5} {v.check}: {v.detail}", file=out)
        if v.fix:
            print(f"      fix: {v.fix}", file=out)


def run(kube: Kube, injector: Injector, namespace: str, output_format: str, out: TextIO) -> int:
    results = verdicts(kube, injector, namespace, datetime.datetime.now(datetime.UTC))
    print_verdicts(results, output_format, out)
    return 0 if all(v.ok for v in results) else 1
