"""`burstbuffer-injector render` on what people apply: every workload kind, `List`s,
several documents and files, objects without pods, and malformed input.

The real command runs as a process; each rendered object is validated with
kubernetes-validate (1.29 and the newest schemas), and each rendered pod template is
compared with the pod the webhook makes from the original template.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import trustme
import yaml
from cli import render_in_process, run_render
from podcheck import SCHEMA_VERSIONS, admission_review, apply, check_pod, decoded_patch
from webhook import INJECTOR, Webhook, start_webhook, write_pair

from injector import review
from injector.decide import ALREADY_INJECTED
from injector.settings import InjectorSettings
from injector.workloads import TEMPLATES

LABELS = {"app": "train"}


def template(**annotations: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"labels": dict(LABELS)}
    if annotations:
        metadata["annotations"] = annotations
    spec = {"restartPolicy": "Never", "containers": [{"name": "train", "image": "python:3.12"}]}
    return {"metadata": metadata, "spec": spec}


def workload(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": "train"}, "spec": spec}


def always(pod_template: dict[str, Any]) -> dict[str, Any]:
    """A template for controllers whose pods must restart (Deployment and the like)."""
    pod_template["spec"]["restartPolicy"] = "Always"
    return pod_template


SELECTOR = {"matchLabels": LABELS}
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"}, "spec": template()["spec"]}
SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "train"},
    "spec": {"selector": LABELS, "ports": [{"port": 80}]},
}
CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}}
# One of each kind, in an order that mixes them, with a Service and a ConfigMap between.
MANIFESTS = [
    POD,
    workload("apps/v1", "Deployment", {"selector": SELECTOR, "template": always(template())}),
    SERVICE,
    workload(
        "apps/v1",
        "StatefulSet",
        {"selector": SELECTOR, "serviceName": "train", "template": always(template())},
    ),
    workload("apps/v1", "DaemonSet", {"selector": SELECTOR, "template": always(template())}),
    workload("apps/v1", "ReplicaSet", {"selector": SELECTOR, "template": always(template())}),
    workload("v1", "ReplicationController", {"selector": LABELS, "template": always(template())}),
    workload("batch/v1", "Job", {"template": template(**{"burstbuffer.io/buffer-size": "4Gi"})}),
    workload(
        "batch/v1",
        "CronJob",
        {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template()}}},
    ),
    {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "train"},
     "template": template()},  # fmt: skip
    CONFIG_MAP,
]
INJECTED = "injected (capture proxy-env, buffer 1Gi Memory)"
EXPECTED_LINES = [
    f"pod/train: {INJECTED}",
    f"deployment/train: {INJECTED}",
    "service/train: unchanged (no pod template)",
    f"statefulset/train: {INJECTED}",
    f"daemonset/train: {INJECTED}",
    f"replicaset/train: {INJECTED}",
    f"replicationcontroller/train: {INJECTED}",
    "job/train: injected (capture proxy-env, buffer 4Gi Memory)",
    f"cronjob/train: {INJECTED}",
    f"podtemplate/train: {INJECTED}",
    "configmap/cfg: unchanged (no pod template)",
]


def template_path(document: dict[str, Any]) -> tuple[str, ...]:
    group = document["apiVersion"].rpartition("/")[0]
    return TEMPLATES[(group, document["kind"])]


def at(document: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        document = document[key]
    return document


def as_pod(pod_template: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", **pod_template}


def webhook_pod(pod_template: dict[str, Any], namespace: str = "ml") -> dict[str, Any]:
    """The pod the webhook makes of a pod created from `pod_template`, in process."""
    pod = as_pod(copy.deepcopy(pod_template))
    response = review.answer(admission_review(pod, namespace), InjectorSettings()).review
    return apply(pod, decoded_patch(response["response"]))


def validate(document: dict[str, Any]) -> None:
    for version in SCHEMA_VERSIONS:
        kubernetes_validate.validate(document, version, strict=True)


def test_the_manifests_are_valid_kubernetes() -> None:
    # Without this, a rendered object that fails validation could be the input's fault.
    for document in MANIFESTS:
        validate(document)


def test_every_kind_is_injected_as_the_webhook_injects_its_pods(tmp_path: Path) -> None:
    (tmp_path / "all.yaml").write_text(yaml.safe_dump_all(MANIFESTS))
    done = run_render("-f", str(tmp_path / "all.yaml"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == EXPECTED_LINES
    rendered = list(yaml.safe_load_all(done.stdout))
    assert [(d["kind"], d["metadata"]["name"]) for d in rendered] == [
        (d["kind"], d["metadata"]["name"]) for d in MANIFESTS
    ]
    for original, document in zip(MANIFESTS, rendered, strict=True):
        validate(document)
        if original["kind"] in ("Service", "ConfigMap"):
            assert document == original
            continue
        path = template_path(original)
        injected = at(document, path)
        if path:
            # Nothing but the template changed, and it is what the webhook makes of it.
            assert {**at(original, path[:-1]), path[-1]: injected} == at(document, path[:-1])
            assert as_pod(injected) == webhook_pod(at(original, path))
            check_pod(as_pod(injected))
        else:
            assert document == webhook_pod(original)
            check_pod(document)
        names = [c["name"] for c in injected["spec"]["initContainers"]]
        assert names == ["burstbuffer"]
        assert "burstbuffer.io/status" in injected["metadata"]["annotations"]


def test_a_rendered_manifest_renders_to_itself(tmp_path: Path) -> None:
    first = run_render(stdin=yaml.safe_dump_all(MANIFESTS))
    again = run_render(stdin=first.stdout)
    assert again.returncode == 0, again.stderr
    assert list(yaml.safe_load_all(again.stdout)) == list(yaml.safe_load_all(first.stdout))
    already = f"not injected: {ALREADY_INJECTED.sentence}"
    assert again.stderr.splitlines() == [
        f"{subject}: {already if what.startswith('injected') else what}"
        for subject, _, what in (line.partition(": ") for line in EXPECTED_LINES)
    ]


def test_a_list_stays_a_list_and_its_items_are_injected() -> None:
    opted_out = template(**{"burstbuffer.io/inject": "false"})
    items = [MANIFESTS[1], SERVICE, workload("batch/v1", "Job", {"template": opted_out})]
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items}
    done = run_render(stdin=json.dumps(listed))
    assert done.returncode == 0, done.stderr
    rendered = yaml.safe_load(done.stdout)
    assert rendered["kind"] == "List" and rendered["metadata"] == {}
    deployment, service, job = rendered["items"]
    for item in rendered["items"]:
        validate(item)
    assert at(deployment, ("spec", "template")) == {
        k: v for k, v in webhook_pod(at(items[0], ("spec", "template"))).items()
        if k not in ("apiVersion", "kind")
    }  # fmt: skip
    assert (service, job) == (SERVICE, items[2])
    assert done.stderr.splitlines() == [
        f"deployment/train: {INJECTED}",
        "service/train: unchanged (no pod template)",
        "job/train: not injected: the pod sets burstbuffer.io/inject=false (label or annotation)",
    ]


def test_files_and_stdin_in_the_order_given(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(SERVICE))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump_all([CONFIG_MAP, MANIFESTS[1]]) + "---\n")
    done = run_render("-f", str(tmp_path / "a.json"), "-f", "-", "-f", str(tmp_path / "b.yaml"),
               stdin=yaml.safe_dump(POD))  # fmt: skip
    assert done.returncode == 0, done.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(done.stdout)]
    assert kinds == ["Service", "Pod", "ConfigMap", "Deployment"]
    assert done.stdout.count("\n---\n") == 3  # several documents stay several documents
    assert [line.split(":")[0] for line in done.stderr.splitlines()] == [
        "service/train", "pod/train", "configmap/cfg", "deployment/train"
    ]  # fmt: skip


def test_one_document_stays_one_document() -> None:
    done = run_render(stdin=json.dumps(POD))
    assert done.returncode == 0 and "---" not in done.stdout
    assert yaml.safe_load(done.stdout) == webhook_pod(POD)


def test_scripts_stay_readable() -> None:
    script = "set -e\nwget https://example.org/a.tar\n"
    with_script = copy.deepcopy(POD)
    with_script["spec"]["containers"][0]["args"] = ["-c", script, "tail  \n"]
    status, out, _ = render_in_process(stdin=json.dumps(with_script))
    assert status == 0
    assert "    - |\n      set -e\n      wget https://example.org/a.tar\n" in out
    assert yaml.safe_load(out)["spec"]["containers"][0]["args"] == ["-c", script, "tail  \n"]


def test_kinds_of_other_groups_and_skipped_pods_pass_unchanged() -> None:
    # A Volcano Job is not a batch Job: its pods are elsewhere, and it is left alone.
    volcano = {**workload("batch.volcano.sh/v1alpha1", "Job", {"tasks": []})}
    host_network = workload(
        "apps/v1", "DaemonSet", {"selector": SELECTOR, "template": always(template())}
    )
    host_network["spec"]["template"]["spec"]["hostNetwork"] = True
    done = run_render(stdin=yaml.safe_dump_all([volcano, host_network]))
    assert done.returncode == 0, done.stderr
    assert list(yaml.safe_load_all(done.stdout)) == [volcano, host_network]
    assert done.stderr.splitlines() == [
        "job/train: unchanged (no pod template)",
        "daemonset/train: not injected: the pod uses the node's network: a loopback proxy "
        "there would serve the whole node",
    ]


def test_warnings_name_their_object() -> None:
    job = workload("batch/v1", "Job", {"template": template(**{"burstbuffer.io/buffer-size": "x"})})
    status, _, err = render_in_process(stdin=yaml.safe_dump(job))
    assert status == 0
    assert err.splitlines() == [
        f"job/train: {INJECTED}",
        "job/train: warning: burstbuffer.io/buffer-size: invalid quantity 'x': expected e.g. "
        "128Mi, 1G or 500m; using the default",
    ]


def test_help_says_what_it_reads_and_writes() -> None:
    done = subprocess.run([str(INJECTOR), "render", "--help"], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    text = " ".join(done.stdout.split())
    for words in ("-f, --filename FILE", "`-` is stdin", "Writes them to stdout as YAML",
                  "a List stays a List", "CronJob", "exits with status 2"):  # fmt: skip
        assert words in text, words


# -- malformed input ---------------------------------------------------------------------

CONTAINER = {"name": "train", "image": "python:3.12"}


def pod(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, **fields}


# The pods of the report, and their neighbours: what each must be answered with.
MALFORMED = [
    (pod(spec={"containers": 5}), "spec.containers: expected a list"),
    ({**pod(spec={"containers": [CONTAINER]}), "metadata": 5}, "metadata: expected an object"),
    (pod(spec={"containers": [5]}), "spec.containers[0]: expected an object"),
    (
        pod(spec={"containers": [{**CONTAINER, "env": 5}]}),
        "spec.containers[0].env: expected a list",
    ),
    (pod(), "spec: required"),
    (pod(spec={}), "spec.containers: required"),
    (pod(spec=[]), "spec: expected an object"),
    (pod(spec={"containers": []}), "spec.containers: expected at least one container"),
    (
        pod(spec={"containers": [{**CONTAINER, "env": [{"name": "A", "value": 5}]}]}),
        "spec.containers[0].env[0].value: expected a string",
    ),
    (
        {**pod(spec={"containers": [CONTAINER]}),
         "metadata": {"labels": {"burstbuffer.io/inject": False}}},
        "metadata.labels[burstbuffer.io/inject]: expected a string",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("document", "error"), MALFORMED, ids=[e for _, e in MALFORMED])
def test_render_names_the_malformed_field(document: dict[str, Any], error: str) -> None:
    done = run_render(stdin=yaml.safe_dump(document))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {error}\n")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def webhook(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    directory = tmp_path_factory.mktemp("render-webhook")
    write_pair(ca, directory)
    server = start_webhook(directory)
    yield server
    assert server.stop() == 0


def test_the_webhook_refuses_them_with_the_same_words(webhook: Webhook, ca: trustme.CA) -> None:
    for document, error in MALFORMED:
        response = webhook.review(ca, admission_review(document))
        assert response["allowed"] is False
        assert response["status"] == {
            "code": 400,
            "message": f"burstbuffer injector: malformed pod: {error}",
        }
    status, metrics = webhook.request(ca, "GET", "/metrics")
    assert status == 200
    assert f"burstbuffer_injector_malformed_total {len(MALFORMED)}.0" in metrics.decode()
    assert "burstbuffer_injector_failed_total 0.0" in metrics.decode()
    assert "Traceback" not in webhook.log.read_text()


def test_the_path_leads_from_the_top_of_the_input(tmp_path: Path) -> None:
    broken = template()
    broken["spec"]["containers"] = [5]
    deployment = workload("apps/v1", "Deployment", {"selector": SELECTOR, "template": broken})
    cronjob = workload("batch/v1", "CronJob", {"schedule": "* * * * *", "jobTemplate": {}})
    listed = {"apiVersion": "v1", "kind": "List", "items": [SERVICE, deployment]}
    (tmp_path / "two.yaml").write_text(yaml.safe_dump_all([SERVICE, deployment]))
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(SERVICE))
    cases = [
        ([], yaml.safe_dump(deployment), "spec.template.spec.containers[0]: expected an object"),
        ([], yaml.safe_dump(cronjob), "spec.jobTemplate.spec: required"),
        ([], json.dumps(listed), "items[1].spec.template.spec.containers[0]: expected an object"),
        ([], json.dumps({**listed, "items": {}}), "items: expected a list"),
        ([], json.dumps({**POD, "kind": 5}), "kind: expected a string"),
        ([], "[1, 2]", "expected an object (a Kubernetes manifest)"),
        ([], "", "no objects in the input"),
        ([], "a: [", "not YAML or JSON: line 1, column 5: expected the node content, but "
                     "found '<stream end>'"),
        (["-f", str(tmp_path / "two.yaml")], "",
         f"{tmp_path / 'two.yaml'}, document 2: spec.template.spec.containers[0]: "
         "expected an object"),
        (["-f", "-", "-f", str(tmp_path / "missing.yaml")], yaml.safe_dump(POD),
         f"{tmp_path / 'missing.yaml'}: No such file or directory"),
        (["-f", str(tmp_path / "good.yaml"), "-f", "-"], "spec: 5",
         "stdin: spec: expected an object"),
    ]  # fmt: skip
    for args, stdin, error in cases:
        assert render_in_process(*args, stdin=stdin) == (2, "", f"error: {error}\n"), error


def test_absurd_nesting_is_named_not_a_crash() -> None:
    deep: Any = []
    for _ in range(100):
        deep = [deep]
    nested = pod(spec={"containers": [{**CONTAINER, "x": deep}]})
    status, out, err = render_in_process(stdin=json.dumps(nested))
    assert (status, out) == (2, "")
    assert err.startswith("error: spec.containers[0].x[0][0]")
    assert err.endswith("[0]: nested more than 64 levels deep\n")
    response = review.answer(admission_review(nested), InjectorSettings()).review["response"]
    assert response["status"]["code"] == 400
    # An object without a pod template is not read, but must still be written back.
    service = {**SERVICE, "spec": {"x": json.loads("[" * 400 + "]" * 400)}}
    done = run_render(stdin=json.dumps(service))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "error: not writable as YAML: nested too deeply\n"
