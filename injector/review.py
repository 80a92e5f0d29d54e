"""AdmissionReview in, AdmissionReview out: decide, mutate, and the JSONPatch between the two.

The patch is always `jsonpatch.make_patch(original, mutated)`, never written by hand, so
it can only ever say what `mutate` did. `render` goes through `inject()` too, which is
why its output and the patched pod of the webhook are the same.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonpatch

from injector import shape
from injector.decide import ALREADY_INJECTED, Decision, decide
from injector.mutate import mutate, rewire
from injector.settings import InjectorSettings

logger = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"
WARNING_PREFIX = "burstbuffer: "

# Outcomes besides the decision's reason codes (metrics labels).
IGNORED = "ignored"
MALFORMED = "malformed"
FAILED = "failed"


class BadReview(ValueError):
    """The body is not an admission.k8s.io/v1 AdmissionReview request with a uid."""


@dataclass(frozen=True)
class Injection:
    """A pod after the decision: mutated if it was injected, unchanged otherwise."""

    decision: Decision
    pod: dict[str, Any]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    """The AdmissionReview to send back, and its outcome for the metrics."""

    review: dict[str, Any]
    outcome: str


def name(obj: Mapping[str, Any]) -> str:
    """An object's name for messages; `generateName*` before the API server names it."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        metadata = {}
    return str(
        metadata.get("name")
        or (f"{metadata['generateName']}*" if metadata.get("generateName") else "<unnamed>")
    )


def describe(pod: Mapping[str, Any], namespace: str = "") -> str:
    """`namespace/name` of a pod for logs."""
    metadata = pod.get("metadata")
    own = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return f"{namespace or own or '<default>'}/{name(pod)}"


def inject(pod: Mapping[str, Any], settings: InjectorSettings, subject: str) -> Injection:
    """Check the pod's shape, decide, then mutate if the decision says so; one log line
    either way. Raises shape.Malformed, naming the field, for a pod it cannot read."""
    problem = shape.problem(pod)
    if problem is not None:
        raise shape.Malformed(problem)
    decision = decide(pod)
    codes = ", ".join(reason.code for reason in decision.reasons)
    if decision.reasons == (ALREADY_INJECTED,):
        # A second call for the same pod (reinvocation) after another webhook added
        # containers: those are wired to the sidecar it has.
        rewired = rewire(pod, settings)
        if rewired is not None and rewired.pod != pod:
            logger.info(
                "pod %s: already injected; the containers added since wired to its sidecar, "
                "%d warning(s)",
                subject,
                len(rewired.warnings),
            )
            return Injection(decision, rewired.pod, rewired.warnings)
    if not decision.inject:
        logger.info("pod %s: skipped (%s)", subject, codes)
        return Injection(decision, copy.deepcopy(dict(pod)), ())
    mutation = mutate(pod, settings)
    logger.info("pod %s: injected, %d warning(s)", subject, len(mutation.warnings))
    return Injection(decision, mutation.pod, mutation.warnings)


def _request(review: object) -> Mapping[str, Any]:
    if not isinstance(review, Mapping):
        raise BadReview("the body is not a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(f"expected an AdmissionReview of {API_VERSION}")
    request = review.get("request")
    if not isinstance(request, Mapping):
        raise BadReview("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("the AdmissionReview request has no uid")
    return request


def _is_pod_creation(request: Mapping[str, Any]) -> bool:
    kind = request.get("kind")
    resource = request.get("resource")
    return (
        isinstance(kind, Mapping)
        and kind.get("kind") == "Pod"
        and kind.get("group", "") == ""
        and isinstance(resource, Mapping)
        and resource.get("resource") == "pods"
        and not request.get("subResource")
        and request.get("operation") == "CREATE"
    )


def answer(review: object, settings: InjectorSettings) -> Answer:
    """The response to one AdmissionReview; raises BadReview for a malformed request.

    Everything that goes wrong past the request's envelope is the injector's problem,
    not the HTTP layer's: the pod is refused with a message saying why.
    """
    request = _request(review)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    result = {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
    if not _is_pod_creation(request):
        return Answer(result, IGNORED)
    pod = request.get("object")
    if not isinstance(pod, Mapping):
        raise BadReview("the pod creation request has no object")
    subject = describe(pod, str(request.get("namespace") or ""))
    try:
        injection = inject(pod, settings, subject)
        operations = jsonpatch.make_patch(pod, injection.pod).patch
    except shape.Malformed as e:
        # The API server would refuse this pod after admission anyway (it validates after
        # the webhooks); refused here, the user reads which field is wrong.
        logger.warning("pod %s: refused, malformed: %s", subject, e)
        response["allowed"] = False
        response["status"] = {"code": 400, "message": f"burstbuffer injector: malformed pod: {e}"}
        return Answer(result, MALFORMED)
    except Exception as e:  # noqa: BLE001 - any failure refuses the pod, it never breaks it
        logger.exception("pod %s: injection failed", subject)
        response["allowed"] = False
        response["status"] = {"code": 500, "message": f"burstbuffer injector: {e}"}
        return Answer(result, FAILED)
    if operations:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(operations).encode()).decode()
    if injection.warnings:
        response["warnings"] = [WARNING_PREFIX + w for w in injection.warnings]
    return Answer(result, injection.decision.reasons[0].code)
