"""The reference web server: nginx serving a directory over HTTPS (and plain HTTP on a
port of its own), as the benchmarks' "as fast as it gets" baseline and as the
unthrottled origin behind the sidecar; and
nginx as a caching reverse proxy in front of such an origin (`proxy_cache`), a peer a
user might run instead of the sidecar.

Everything nginx needs (config, certificate, pid file, temp paths, error log) lives in
one temporary directory; nothing under /etc/nginx is read or written. Debian's
`nginx-light` provides /usr/sbin/nginx; when it is missing it is installed with
apt-get if we are root, otherwise `NginxMissing` says what to do.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import trustme

from bench.harness import Process, free_port, port_open, start_process, wait_until

logger = logging.getLogger(__name__)

NGINX = "/usr/sbin/nginx"
DEBIAN_PACKAGE = "nginx-light"

# Plain static serving, tuned only where the defaults would make nginx look slower than
# it is: one worker per core the benchmark asks for (one where a single sequential
# client is measured), no access log, keep-alive long enough for the small-object run
# on one connection, and connections accepted once their first bytes are in
# (`deferred`, as the sidecar's listeners are).
CONFIG = """\
daemon off;
master_process on;
worker_processes {workers};
{user}
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    types {{ }}
    default_type application/octet-stream;
    sendfile on;
    keepalive_requests 100000;
    keepalive_timeout 60s;
{http}
    server {{
        listen 127.0.0.1:{port} ssl deferred;
        listen 127.0.0.1:{plain_port} deferred;
{origin_listen}
        ssl_certificate {dir}/server.pem;
        ssl_certificate_key {dir}/server.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        {location}
    }}
}}
"""
STATIC = "location /files/ {{ alias {root}/; }}"
# The caching peer, as it was measured (`shared/notes/peers.md`): origin connections
# kept alive and TLS sessions reused, the origin verified (TLS 1.3 named: nginx's
# default list lacks it, and the origin may refuse anything older).
CACHE_HTTP = """\
    proxy_cache_path {dir}/cache levels=1:2 keys_zone=c:10m max_size=4g use_temp_path=off;
    upstream origin {{ server 127.0.0.1:{origin_port}; keepalive 32; }}"""
CACHE_LOCATION = """location /files/ {{
            proxy_pass https://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host {host};
            proxy_ssl_server_name on;
            proxy_ssl_name {host};
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {dir}/ca.pem;
            proxy_ssl_session_reuse on;
            proxy_ssl_protocols TLSv1.2 TLSv1.3;
            proxy_cache c;
            proxy_cache_valid 200 1d;
        }}"""


class NginxMissing(RuntimeError):
    """nginx is not installed and cannot be installed from here."""


@dataclass
class Nginx:
    port: int
    process: Process
    ca_pem: Path
    plain_port: int  # the same server over plain HTTP

    def url(self, name: str, host: str, query: str = "") -> str:
        return f"https://{host}:{self.port}/files/{name}" + (f"?{query}" if query else "")

    def plain_url(self, name: str, host: str) -> str:
        return f"http://{host}:{self.plain_port}/files/{name}"

    def stop(self) -> None:
        self.process.stop()


def ensure_installed() -> str:
    """The nginx binary, installing Debian's nginx-light first when root and missing."""
    if os.access(NGINX, os.X_OK):
        return NGINX
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise NginxMissing(
            f"{NGINX} not found: install it (`apt-get install {DEBIAN_PACKAGE}`) and rerun"
        )
    logger.info("installing %s with apt-get", DEBIAN_PACKAGE)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", DEBIAN_PACKAGE],
        env=env,
        check=True,
        timeout=600,
    )
    if not os.access(NGINX, os.X_OK):
        raise NginxMissing(f"{DEBIAN_PACKAGE} was installed but {NGINX} is still missing")
    return NGINX


def start_nginx(
    root: Path,
    ca: trustme.CA,
    names: list[str],
    workdir: Path,
    workers: int = 1,
    origin_address: str | None = None,
) -> Nginx:
    """nginx serving `root` under https://<name>:<port>/files/, certificate from `ca`,
    with `workers` worker processes; also on `origin_address`'s ports 443 and 80 if
    given, as an origin that a name resolves to is reached (in a network namespace of
    a benchmark's own, where those ports are free)."""
    origin_listen = (
        f"        listen {origin_address}:443 ssl deferred;\n"
        f"        listen {origin_address}:80 deferred;"
        if origin_address
        else ""
    )
    return _start(ca, names, workdir, workers, "", STATIC.format(root=root), origin_listen)


def start_nginx_cache(
    origin: Nginx, ca: trustme.CA, names: list[str], workdir: Path, workers: int = 1
) -> Nginx:
    """nginx caching `origin` (whose certificate `ca` signed, as it signs this one's)
    under https://<name>:<port>/files/, its cache in `workdir`."""
    http = CACHE_HTTP.format(dir=workdir, origin_port=origin.port)
    location = CACHE_LOCATION.format(dir=workdir, host=names[0])
    return _start(ca, names, workdir, workers, http, location, "")


def _start(
    ca: trustme.CA,
    names: list[str],
    workdir: Path,
    workers: int,
    http: str,
    location: str,
    origin_listen: str,
) -> Nginx:
    binary = ensure_installed()
    workdir.mkdir(parents=True, exist_ok=True)
    cert = ca.issue_cert(*names, "127.0.0.1")
    cert.private_key_pem.write_to_path(str(workdir / "server.key"))
    cert.cert_chain_pems[0].write_to_path(str(workdir / "server.pem"))
    ca_pem = workdir / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    port, plain_port = free_port(), free_port()
    # Workers drop to `nobody` by default, who cannot read a private temp directory.
    user = "user root;" if os.geteuid() == 0 else ""
    config = workdir / "nginx.conf"
    config.write_text(
        CONFIG.format(
            dir=workdir,
            port=port,
            plain_port=plain_port,
            user=user,
            workers=workers,
            http=http,
            location=location,
            origin_listen=origin_listen,
        )
    )
    argv = [binary, "-e", str(workdir / "error.log"), "-p", str(workdir), "-c", str(config)]
    process = start_process(argv, workdir / "nginx.out")
    try:
        wait_until(lambda: _listening(process, port), f"nginx on port {port}")
    except (TimeoutError, RuntimeError):
        process.stop()
        raise
    return Nginx(port, process, ca_pem, plain_port)


def _listening(process: Process, port: int) -> bool:
    if process.popen.poll() is not None:
        log = process.log.parent / "error.log"
        raise RuntimeError(f"nginx exited:\n{process.output()}{log.read_text(errors='replace')}")
    return port_open(port)
