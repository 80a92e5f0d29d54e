"""A real Prometheus server for tests: Debian's `prometheus`, on loopback, scraping the
targets a test gives it every second, and its HTTP API (`/api/v1/...`)."""

from __future__ import annotations

import json
import math
import shutil
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.harness import Process, clean_env, free_port, http_get, start_process, wait_until

SCRAPE_INTERVAL = "1s"


@dataclass
class Prometheus:
    process: Process
    port: int

    def api(self, path: str, **parameters: str) -> Any:
        """The `data` of a successful API answer."""
        query = urllib.parse.urlencode(parameters)
        status, body = http_get(f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}")
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", (path, parameters, answer)
        return answer["data"]

    def query(self, expression: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's samples, each as (labels, value)."""
        data = self.api("query", query=expression)
        assert data["resultType"] == "vector", data
        return [(sample["metric"], float(sample["value"][1])) for sample in data["result"]]

    def value(self, expression: str) -> float:
        """The one finite value an expression gives (or the test fails)."""
        samples = self.query(expression)
        assert len(samples) == 1 and math.isfinite(samples[0][1]), (expression, samples)
        return samples[0][1]

    def names(self) -> set[str]:
        """Every metric name Prometheus holds series of."""
        return set(self.api("label/__name__/values"))

    def targets_up(self) -> bool:
        targets = self.api("targets", state="active")["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    def stop(self) -> None:
        self.process.stop()


def start_prometheus(
    directory: Path, scrape_configs: list[dict[str, Any]], rule_files: tuple[Path, ...] = ()
) -> Prometheus:
    """Prometheus scraping `scrape_configs`, with `rule_files` loaded; returns once it is
    ready (its targets may not be scraped yet). Skips the test where it is not installed."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus: Debian's prometheus package (.ci/system-deps installs it)")
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": scrape_configs,
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        binary,
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    server = Prometheus(start_process(argv, directory / "prometheus.log", clean_env()), port)

    def ready() -> bool:
        if server.process.popen.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{server.process.output()}")
        try:
            return http_get(f"http://127.0.0.1:{port}/-/ready")[0] == 200
        except OSError:
            return False

    wait_until(ready, "Prometheus ready")
    return server
