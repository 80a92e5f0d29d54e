"""The shape of a pod: a pure check that the fields the injector reads or writes have the
JSON types Kubernetes gives them, and that a pod has what makes it a pod.

It runs once, before `decide` and `mutate` read the pod, so that they can rely on the
types, and a bad input is named by its path (`spec.containers[0]: expected an object`)
instead of ending in a TypeError deep inside the mutation. The API server decodes a pod
before it calls webhooks (a wrong type never reaches the webhook from it), but it
validates only after them: a pod without containers does reach us. `render` reads
whatever a file holds. Fields the injector neither reads nor writes (the image's
registry, a volume's source, an env var's `valueFrom`) are the API server's business.

A null is an absent field, as in Kubernetes' own JSON decoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Problem:
    """The first thing wrong with a pod: where (a field path; empty for the whole) and what."""

    path: str
    what: str

    def under(self, prefix: str) -> Problem:
        """The same problem, seen from an object that holds the pod at `prefix`."""
        return Problem(".".join(p for p in (prefix, self.path) if p), self.what)

    def __str__(self) -> str:
        return f"{self.path}: {self.what}" if self.path else self.what


class Malformed(ValueError):
    """An input the injector cannot read; `problem` says where and what."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class Shape(Protocol):
    """A JSON type; `problem` checks a value that is present (not null)."""

    noun: str

    def problem(self, value: Any, path: str) -> Problem | None: ...


class Scalar:
    def __init__(self, kind: type, noun: str) -> None:
        self.kind = kind
        self.noun = noun

    def problem(self, value: Any, path: str) -> Problem | None:
        # bool is an int in Python, never in JSON.
        if isinstance(value, self.kind) and (self.kind is bool or not isinstance(value, bool)):
            return None
        return Problem(path, f"expected {self.noun}")


STRING = Scalar(str, "a string")
BOOLEAN = Scalar(bool, "true or false")
INTEGER = Scalar(int, "an integer")


class AnyObject:
    """An object whose fields are not the injector's concern."""

    noun = "an object"

    def problem(self, value: Any, path: str) -> Problem | None:
        return None if isinstance(value, Mapping) else Problem(path, f"expected {self.noun}")


class Object(AnyObject):
    """An object with known fields; fields not listed are left alone."""

    def __init__(self, fields: Mapping[str, Shape], required: tuple[str, ...] = ()) -> None:
        self.fields = fields
        self.required = required

    def problem(self, value: Any, path: str) -> Problem | None:
        found = super().problem(value, path)
        if found is not None:
            return found
        for key, shape in self.fields.items():
            where = f"{path}.{key}" if path else key
            item = value.get(key)
            if item is None:
                if key in self.required:
                    return Problem(where, "required")
                continue
            found = shape.problem(item, where)
            if found is not None:
                return found
        return None


class ListOf:
    noun = "a list"

    def __init__(self, item: Shape, at_least_one: str = "") -> None:
        self.item = item
        # What one item is called, when the list must not be empty.
        self.at_least_one = at_least_one

    def problem(self, value: Any, path: str) -> Problem | None:
        if not isinstance(value, list):
            return Problem(path, f"expected {self.noun}")
        if self.at_least_one and not value:
            return Problem(path, f"expected at least one {self.at_least_one}")
        for i, item in enumerate(value):
            where = f"{path}[{i}]"
            if item is None:
                return Problem(where, f"expected {self.item.noun}")
            found = self.item.problem(item, where)
            if found is not None:
                return found
        return None


class MapOf:
    """An object with string keys and values of one shape (labels, annotations)."""

    noun = "an object"

    def __init__(self, value: Shape) -> None:
        self.value = value

    def problem(self, value: Any, path: str) -> Problem | None:
        if not isinstance(value, Mapping):
            return Problem(path, f"expected {self.noun}")
        for key, item in value.items():
            if not isinstance(key, str):
                return Problem(path, f"expected string keys, found {key!r}")
            if item is not None:
                found = self.value.problem(item, f"{path}[{key}]")
                if found is not None:
                    return found
        return None


_METADATA = Object(
    {
        "name": STRING,
        "generateName": STRING,
        "namespace": STRING,
        "labels": MapOf(STRING),
        "annotations": MapOf(STRING),
    }
)
_ENV_VAR = Object({"name": STRING, "value": STRING, "valueFrom": AnyObject()}, ("name",))
_VOLUME_MOUNT = Object(
    {"name": STRING, "mountPath": STRING, "subPath": STRING, "readOnly": BOOLEAN},
    ("name", "mountPath"),
)
_CONTAINER = Object(
    {
        "name": STRING,
        "image": STRING,
        "command": ListOf(STRING),
        "args": ListOf(STRING),
        "env": ListOf(_ENV_VAR),
        "volumeMounts": ListOf(_VOLUME_MOUNT),
        "restartPolicy": STRING,
        "securityContext": Object({"runAsUser": INTEGER}),
    },
    ("name",),
)
_SYSCTL = Object({"name": STRING, "value": STRING}, ("name", "value"))
_SPEC = Object(
    {
        "containers": ListOf(_CONTAINER, at_least_one="container"),
        "initContainers": ListOf(_CONTAINER),
        "volumes": ListOf(Object({"name": STRING}, ("name",))),
        "hostNetwork": BOOLEAN,
        "hostAliases": ListOf(Object({"ip": STRING, "hostnames": ListOf(STRING)})),
        "securityContext": Object({"runAsUser": INTEGER, "sysctls": ListOf(_SYSCTL)}),
        "os": Object({"name": STRING}),
        "nodeSelector": MapOf(STRING),
    },
    ("containers",),
)
POD = Object(
    {"apiVersion": STRING, "kind": STRING, "metadata": _METADATA, "spec": _SPEC}, ("spec",)
)


# Far deeper than any pod (the deepest fields, in affinity terms, are about 10 levels
# down), far shallower than the recursion that copying and serialising the pod needs.
MAX_DEPTH = 64


def _too_deep(value: object) -> Problem | None:
    """A node nested deeper than MAX_DEPTH, looked for without recursion."""
    # Each entry: (node, depth, its parent's entry, its key there); the path is spelt out
    # only for the node found, so the walk costs little for the pods that pass.
    stack: list[_Entry] = [(value, 0, None, None)]
    while stack:
        entry = stack.pop()
        node, depth = entry[0], entry[1]
        if isinstance(node, Mapping):
            children: Any = node.items()
        elif isinstance(node, list):
            children = enumerate(node)
        else:
            continue
        if depth == MAX_DEPTH:
            return Problem(_path(entry), f"nested more than {MAX_DEPTH} levels deep")
        stack += [(child, depth + 1, entry, key) for key, child in children]
    return None


_Entry = tuple[object, int, Any, object]


def _path(entry: _Entry) -> str:
    path = ""
    while entry[2] is not None:
        key = entry[3]
        path = (f"[{key}]" if isinstance(key, int) else f".{key}") + path
        entry = entry[2]
    return path.removeprefix(".")


def problem(pod: object) -> Problem | None:
    """The first problem of a pod (plain JSON data), or None if the injector can read it."""
    return _too_deep(pod) or POD.problem(pod, "")
