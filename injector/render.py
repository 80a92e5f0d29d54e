"""`burstbuffer-injector render`: manifests in, the same manifests with their pods injected
out, for offline use (like `istioctl kube-inject`).

Reads YAML or JSON documents from files or stdin, hands each to `workloads.render`, and
writes YAML in the same order and form: a document per document, a `List` as a `List`.
Each object gets one line on stderr saying what was done (and one per warning). A
malformed input writes nothing but one line saying where it is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, BinaryIO, TextIO

import yaml

from injector import names, workloads
from injector.settings import InjectorSettings
from injector.shape import Malformed

STDIN = "-"


class RenderError(ValueError):
    """The input cannot be rendered; the message says where and why, in one line."""


class _Dumper(yaml.SafeDumper):
    """Plain YAML: no `&id001` anchors where two fields happen to hold equal objects, and
    scripts (multi-line strings) as literal blocks, as people write them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    # The emitter falls back to a quoted string where a block cannot hold the text.
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _string)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _located(where: list[str], message: object) -> RenderError:
    return RenderError(f"{', '.join(where)}: {message}" if where else str(message))


def _documents(data: bytes, where: list[str]) -> list[object]:
    """The documents of one input, empty ones (a trailing `---`) left out as kubectl does."""
    try:
        return [d for d in yaml.safe_load_all(data) if d is not None]
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise _located(where, f"not YAML or JSON: {at}{_one_line(e.problem or e)}") from None
    except yaml.YAMLError as e:
        raise _located(where, f"not YAML or JSON: {_one_line(e)}") from None
    except RecursionError:
        raise _located(where, "not readable: nested too deeply") from None


def _read(source: str, stdin: BinaryIO) -> bytes:
    if source == STDIN:
        return stdin.read()
    try:
        with open(source, "rb") as file:
            return file.read()
    except OSError as e:
        raise RenderError(f"{source}: {e.strerror or e}") from None


def report(outcome: workloads.Outcome) -> list[str]:
    """The stderr lines of one object: what was done, then its warnings."""
    injection = outcome.injection
    if injection is None:
        return [f"{outcome.subject}: unchanged (no pod template)"]
    if not injection.decision.inject:
        reasons = "; ".join(reason.sentence for reason in injection.decision.reasons)
        return [f"{outcome.subject}: not injected: {reasons}"]
    status = json.loads(injection.pod["metadata"]["annotations"][names.STATUS])
    buffer = status["buffer"]
    done = f"injected (capture {status['capture']}, buffer {buffer['size']} {buffer['medium']})"
    warnings = [f"{outcome.subject}: warning: {w}" for w in injection.warnings]
    return [f"{outcome.subject}: {done}", *warnings]


def render(
    sources: Sequence[str],
    stdin: BinaryIO,
    out: TextIO,
    err: TextIO,
    settings: InjectorSettings,
    namespace: str,
) -> None:
    """Render every document of `sources` (file names, `-` for stdin; none: stdin).

    Raises RenderError before writing anything if any input is unreadable or malformed.
    """
    rendered: list[workloads.Rendered] = []
    sources = sources or [STDIN]
    for source in sources:
        # Messages name the input when there are several, or it is a file.
        where = [] if sources == [STDIN] else ["stdin" if source == STDIN else source]
        documents = _documents(_read(source, stdin), where)
        for number, document in enumerate(documents, start=1):
            try:
                rendered.append(workloads.render(document, settings, namespace))
            except Malformed as e:
                numbered = [*where, f"document {number}"] if len(documents) > 1 else where
                raise _located(numbered, e) from None
    if not rendered:
        raise RenderError("no objects in the input")
    try:
        text = yaml.dump_all([r.document for r in rendered], Dumper=_Dumper, sort_keys=False)
    except RecursionError:
        # An object the injector passes through unread (no pod template) can be that deep.
        raise RenderError("not writable as YAML: nested too deeply") from None
    for done in rendered:
        for outcome in done.outcomes:
            for line in report(outcome):
                print(line, file=err)
    out.write(text)
