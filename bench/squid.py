"""A real Squid: the shared parent cache of the parent-tier tests and benchmark, and
the ssl-bump forward proxy a user might run instead of the sidecar (a benchmark peer).

Everything Squid needs (config, cache_dir, logs, pid file, the origins' CA, a hosts
file naming the test origins) lives in one temporary directory; nothing under
/etc/squid is read or written. Squid runs in the foreground (`-N`) on loopback. Run as
root it drops to `cache_effective_user` (Debian's `proxy`), so the directory is made
theirs. The config is the one the chart renders, minus Kubernetes: one object is
fetched from the origin once however it is asked for (ranges join the whole fetch,
concurrent misses collapse, an abandoned fetch still completes). As a peer (`bump`)
it intercepts CONNECT with ssl-bump, minting leaf certificates from the given CA, and
keeps small objects in memory, as the peers were measured (`shared/notes/peers.md`).

Squid must be built with OpenSSL (Debian's `squid-openssl`): Debian's `squid` 5.7 is
built with GnuTLS, which broke off every TLS 1.3 response from the test origins and,
with TLS 1.3 turned off, accepted an origin certificate from a CA it was not given.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import trustme

from bench.harness import Process, free_port, port_open, start_process, wait_until

SQUID = "/usr/sbin/squid"
DEBIAN_PACKAGE = "squid-openssl"
START_TIMEOUT = 20.0  # seconds for Squid to listen

CONFIG = """\
http_port 127.0.0.1:{port}{bump_options}
{https_port}
{bump}
pid_filename {dir}/squid.pid
cache_effective_user {user}
cache_dir ufs {dir}/cache {cache_dir_mb} 4 16
cache_mem {cache_mem_mb} MB
maximum_object_size 4 GB
maximum_object_size_in_memory {in_memory}
access_log stdio:{dir}/access.log squid
cache_store_log none
cache_log {dir}/cache.log
coredump_dir {dir}
hosts_file {dir}/hosts
tls_outgoing_options cafile={dir}/origin-ca.pem
acl loopback src 127.0.0.0/8
# Stands for the chart's ACL of intercepted hosts: URLs naming this are refused.
acl refused url_regex refused-by-parent
http_access deny refused
http_access allow loopback
http_access deny all
range_offset_limit -1
collapsed_forwarding on
quick_abort_min -1 KB
refresh_pattern . 1440 20% 10080 override-lastmod
shutdown_lifetime 0 seconds
pinger_enable off
netdb_filename none
logfile_rotate 0
via off
# The tests tell objects apart by their query strings (Squid strips them by default).
strip_query_terms off
"""
# What a bumping peer adds: certificates minted by a helper from `bump.pem` (the CA
# and its key), every CONNECT peeked at and bumped.
BUMP = """\
sslcrtd_program {certgen} -s {dir}/certs -M 16MB
sslcrtd_children 4 startup=1 idle=1
acl step1 at_step SslBump1
ssl_bump peek step1
ssl_bump bump all
"""
CERTGEN = "/usr/lib/squid/security_file_certgen"


class SquidMissing(RuntimeError):
    """Squid built with OpenSSL is not installed (`apt-get install squid-openssl`)."""


@dataclass
class Squid:
    port: int
    directory: Path
    process: Process
    tls_port: int | None = None  # with a certificate: Squid also speaks TLS to clients
    service: str = "squid"  # its `-n` name, which its shared memory segments carry

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def tls_url(self) -> str:
        assert self.tls_port is not None, "start_squid(..., tls=...) first"
        return f"https://127.0.0.1:{self.tls_port}"

    def access_log(self) -> list[tuple[str, str, str]]:
        """(result code, method, URL) per request Squid answered, e.g.
        ("TCP_MISS/200", "GET", "https://origin.test:4433/files/a.bin")."""
        path = self.directory / "access.log"
        if not path.exists():
            return []
        entries = []
        for line in path.read_text(errors="replace").splitlines():
            fields = line.split()
            if len(fields) >= 7:
                entries.append((fields[3], fields[5], fields[6]))
        return entries

    def version(self) -> str:
        return ensure_installed()

    def urls(self) -> list[str]:
        return [url for _, _, url in self.access_log()]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.process.stop(sig)

    def remove(self) -> None:
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.directory, ignore_errors=True)
        for segment in Path("/dev/shm").glob(f"{self.service}-*.shm"):
            segment.unlink(missing_ok=True)  # a killed Squid leaves them behind


def ensure_installed() -> str:
    """The Squid version; SquidMissing when there is none built with OpenSSL."""
    if not os.access(SQUID, os.X_OK):
        raise SquidMissing(f"{SQUID} not found: `apt-get install {DEBIAN_PACKAGE}` and rerun")
    version = subprocess.run([SQUID, "-v"], capture_output=True, text=True, check=False).stdout
    if "--with-openssl" not in version:
        raise SquidMissing(f"{SQUID} is not built with OpenSSL: `apt-get install {DEBIAN_PACKAGE}`")
    return version.split("\n")[0].removeprefix("Squid Cache: Version ").strip()


def start_squid(
    origin_ca: Path,
    names: list[str],
    tls: trustme.LeafCert | None = None,
    bump: trustme.CA | None = None,
    under: Path | None = None,
) -> Squid:
    """Squid on a free loopback port, trusting `origin_ca` for origins and resolving
    `names` to 127.0.0.1; with `tls` on a second port over TLS (https_port); with
    `bump`, intercepting CONNECT with leaf certificates from that CA. Its directory is
    made in `under` (default: the system's temporary directory). `remove()` it when
    done."""
    ensure_installed()
    # Not under pytest's private tmp: the unprivileged Squid user must reach it.
    directory = Path(tempfile.mkdtemp(prefix="burstbuffer-squid-", dir=under))
    os.chmod(directory, 0o755)
    user = pwd.getpwnam("proxy") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
    port = free_port()
    tls_port = free_port() if tls is not None else None
    https_port = ""
    if tls is not None:
        tls.private_key_and_cert_chain_pem.write_to_path(str(directory / "tls.pem"))
        https_port = f"https_port 127.0.0.1:{tls_port} tls-cert={directory}/tls.pem"
    sizes = {"cache_dir_mb": 512, "cache_mem_mb": 16, "in_memory": "1 MB"}
    bump_options = bump_config = ""
    if bump is not None:
        (directory / "bump.pem").write_bytes(bump.cert_pem.bytes() + bump.private_key_pem.bytes())
        bump_options = f" ssl-bump generate-host-certificates=on tls-cert={directory}/bump.pem"
        bump_config = BUMP.format(certgen=CERTGEN, dir=directory)
        _run([CERTGEN, "-c", "-s", str(directory / "certs"), "-M", "16MB"])
        sizes = {"cache_dir_mb": 4000, "cache_mem_mb": 1200, "in_memory": "2 MB"}
    config = directory / "squid.conf"
    config.write_text(
        CONFIG.format(
            port=port,
            dir=directory,
            user=user.pw_name,
            https_port=https_port,
            bump_options=bump_options,
            bump=bump_config,
            **sizes,
        )
    )
    shutil.copyfile(origin_ca, directory / "origin-ca.pem")
    (directory / "hosts").write_text("127.0.0.1 localhost " + " ".join(names) + "\n")
    (directory / "cache").mkdir()
    for path in [directory, *directory.rglob("*")]:
        os.chown(path, user.pw_uid, user.pw_gid)
    # Squid names its shared memory segments (/dev/shm/NAME-*.shm) after its service:
    # one of its own, so that Squids running at once never share them.
    service = "burstbuffer" + directory.name.rpartition("-")[2].replace("_", "")
    argv = [SQUID, "-N", "-n", service, "-f", str(config)]
    initialised = start_process([*argv, "-z"], directory / "squid-z.out")
    initialised.popen.wait(timeout=START_TIMEOUT)
    process = start_process(argv, directory / "squid.out")
    squid = Squid(port, directory, process, tls_port, service)

    def listening() -> bool:
        if process.popen.poll() is not None:
            cache_log = directory / "cache.log"
            log = cache_log.read_text(errors="replace") if cache_log.exists() else ""
            raise RuntimeError(f"squid exited:\n{process.output()}{log}")
        return port_open(port)

    try:
        wait_until(listening, f"squid on port {port}", START_TIMEOUT)
    except BaseException:
        squid.remove()
        raise
    return squid


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
