"""The README's "Try it on a real cluster", run word for word on the cluster (but for
`make cluster` and `make cluster-down`: the session's fixture starts and stops it)."""

from __future__ import annotations

import re
import subprocess

from tests.cluster.conftest import Cluster
from tests.cluster.layout import ROOT

README = ROOT / "README.md"
# The cleanup's own lines, run again if the walkthrough stopped before them.
CLEANUP = (
    "helm uninstall burstbuffer -n burstbuffer-system --wait",
    "kubectl delete namespace training datasets burstbuffer-system --ignore-not-found",
)


def walkthrough() -> str:
    """The README's walkthrough block, without the lines that make or remove the cluster."""
    text = README.read_text()
    pattern = r"<!-- walkthrough -->\n```sh\n(.*?)```\n<!-- /walkthrough -->"
    (block,) = re.findall(pattern, text, re.S)
    lines = [line for line in block.splitlines() if not line.startswith("make cluster")]
    return "\n".join(lines)


def test_the_readme_walkthrough_runs_as_written(cluster: Cluster) -> None:
    script = walkthrough()
    assert "helm install burstbuffer charts/burstbuffer" in script
    try:
        done = subprocess.run(
            ["bash", "-euxo", "pipefail", "-c", script], cwd=ROOT, env=cluster.env(),
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    finally:
        for line in CLEANUP:
            cluster.run(*line.split(), check=False)
    output = done.stdout
    assert done.returncode == 0, f"{output[-3000:]}\n{done.stderr[-3000:]}"
    assert re.search(r"^first download: \d+ ms$", output, re.M), output
    assert re.search(r"^second download: \d+ ms$", output, re.M), output
    # `kubectl burstbuffer status`: the Job's pod, its sidecar read, one miss and one hit.
    rows = [line.split() for line in output.splitlines() if line.startswith("training ")]
    (row,) = [row for row in rows if row[1].startswith("download-twice-")]
    # NAMESPACE POD CAPTURE BUFFER(size medium) USED ENTRIES HITS MISSES ... STATE
    assert (row[0], row[7], row[8], row[-1]) == ("training", "1", "1", "ok"), row
