"""The reference proxy: plain `mitmdump` passing HTTPS through with streaming on.

It is what the sidecar would be without its cache: mitmproxy's own addons, bodies
streamed past 1 MiB, the origin verified against its CA, run in a private mount
namespace with the same /etc/hosts as the sidecar. `-q` keeps it from printing every
flow, which would only make the reference slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.harness import (
    PYTHON,
    Process,
    clean_env,
    free_port,
    port_open,
    private_mounts,
    start_process,
    wait_until,
)

MITMDUMP = str(Path(PYTHON).parent / "mitmdump")


@dataclass
class Mitmdump:
    port: int
    process: Process
    confdir: Path

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ca_pem(self) -> Path:
        """The CA mitmdump makes in its confdir on first start; clients trust it."""
        return self.confdir / "mitmproxy-ca-cert.pem"

    @property
    def pid(self) -> int:
        return self.process.popen.pid

    def ready(self) -> bool:
        if self.process.popen.poll() is not None:
            raise RuntimeError(f"mitmdump exited:\n{self.process.output()}")
        return port_open(self.port)

    def stop(self) -> None:
        self.process.stop()


def launch_mitmdump(workdir: Path, hosts: Path, upstream_ca: Path) -> Mitmdump:
    """Start mitmdump without waiting for it (the ready-time benchmark times that)."""
    workdir.mkdir(parents=True, exist_ok=True)
    confdir = workdir / "confdir"
    port = free_port()
    argv = [
        MITMDUMP, "-q",
        "--listen-host", "127.0.0.1", "--listen-port", str(port),
        "--set", f"confdir={confdir}",
        "--set", "stream_large_bodies=1m",
        "--set", f"ssl_verify_upstream_trusted_ca={upstream_ca}",
    ]  # fmt: skip
    process = start_process(
        private_mounts({"/etc/hosts": hosts}, argv), workdir / "mitmdump.log", clean_env()
    )
    return Mitmdump(port, process, confdir)


def start_mitmdump(workdir: Path, hosts: Path, upstream_ca: Path) -> Mitmdump:
    proxy = launch_mitmdump(workdir, hosts, upstream_ca)
    try:
        wait_until(proxy.ready, "mitmdump to listen")
        wait_until(proxy.ca_pem.is_file, "mitmdump's CA")
    except (TimeoutError, RuntimeError):
        proxy.stop()
        raise
    return proxy
