"""Where the pods are in what people apply: the pod template of each workload kind, and
the objects of a `List`.

Pure: a document in, the document with its pod template injected out. A template is
injected through `review.inject`, as the webhook injects the pods a controller makes
from it, so it gets the same containers, volumes and annotations (the status annotation
included); a pod made from an injected template is already injected, and the webhook
then leaves it alone. Objects of other kinds (Services, ConfigMaps, custom resources)
come out unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from injector import review
from injector.settings import InjectorSettings
from injector.shape import Malformed, Problem

# (API group, kind) -> the path of the pod template in such an object; () is a Pod itself.
TEMPLATES: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "Pod"): (),
    ("", "PodTemplate"): ("template",),
    ("", "ReplicationController"): ("spec", "template"),
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}


@dataclass(frozen=True)
class Outcome:
    """What became of one object: `subject` is `kind/name`, as kubectl names objects;
    `injection` is None for an object without a pod template."""

    subject: str
    injection: review.Injection | None


@dataclass(frozen=True)
class Rendered:
    """A document after injection, and the outcome of each object in it, in order."""

    document: Any
    outcomes: tuple[Outcome, ...]


def _at(prefix: str, key: str) -> str:
    return ".".join(part for part in (prefix, key) if part)


def _string(document: Mapping[str, Any], key: str, default: str, at: str) -> str:
    value = document.get(key, default)
    if not isinstance(value, str):
        raise Malformed(Problem(_at(at, key), "expected a string"))
    return value


def _template(document: Mapping[str, Any], path: tuple[str, ...], at: str) -> Mapping[str, Any]:
    node = document
    for depth, key in enumerate(path, start=1):
        child = node.get(key)
        if not isinstance(child, Mapping):
            where = _at(at, ".".join(path[:depth]))
            raise Malformed(Problem(where, "required" if child is None else "expected an object"))
        node = child
    return node


def _replace(node: Mapping[str, Any], path: tuple[str, ...], value: Any) -> Any:
    """`node` with the value at `path` replaced, copying only the objects on the way."""
    if not path:
        return value
    return {**node, path[0]: _replace(node[path[0]], path[1:], value)}


def render(document: object, settings: InjectorSettings, namespace: str, at: str = "") -> Rendered:
    """Inject the pod templates of one document (a `List`'s items one by one).

    `namespace`, if given, names the objects' namespace in the log; `at` is the
    document's path in an enclosing `List`, for messages. A document without `kind` is
    read as a Pod. Raises Malformed, with the field's path from the document's top, for
    an object that is not one, a workload without its template, or a template the
    injector cannot read.
    """
    if not isinstance(document, Mapping):
        raise Malformed(Problem(at, "expected an object (a Kubernetes manifest)"))
    kind = _string(document, "kind", "Pod", at)
    group = _string(document, "apiVersion", "v1", at).rpartition("/")[0]
    if (group, kind) == ("", "List"):
        items = document.get("items")
        if not isinstance(items, list):
            raise Malformed(Problem(_at(at, "items"), "expected a list"))
        done = [
            render(item, settings, namespace, f"{_at(at, 'items')}[{i}]")
            for i, item in enumerate(items)
        ]
        outcomes = tuple(outcome for rendered in done for outcome in rendered.outcomes)
        return Rendered({**document, "items": [r.document for r in done]}, outcomes)

    subject = f"{kind.lower()}/{review.name(document)}"
    path = TEMPLATES.get((group, kind))
    if path is None:
        return Rendered(document, (Outcome(subject, None),))
    pod = _template(document, path, at)
    try:
        injection = review.inject(pod, settings, review.describe(document, namespace))
    except Malformed as e:
        raise Malformed(e.problem.under(_at(at, ".".join(path)))) from None
    return Rendered(_replace(document, path, injection.pod), (Outcome(subject, injection),))
