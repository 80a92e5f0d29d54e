"""The chart's parent cache: Dockerfile.squid built on the local base, run as the chart
runs it, and used as the parent of injected pods' sidecars.

The chart is rendered with Helm's engine (tests/chart/helmchart.py) with parentCache
enabled and one replica. Squid's pod is the StatefulSet's pod template as the controller
makes replica 0 of it (the volume claim template becomes that replica's claim), run by
`DockerPod` with the rendered ConfigMap (squid.conf) and the origins' CA ConfigMap the
chart gives both Squid and the sidecars (`sidecar.upstreamCA`). Two pods are injected
by `burstbuffer-injector render` with the injector configuration the chart renders, so
their sidecars' --parent names replica 0 by its StatefulSet name (which the pods'
/etc/hosts resolves to Squid's pod, as the cluster's DNS would).

The second origin's CA was added to the CA ConfigMap after Squid started (Squid reads
its CA files at start): the sidecars trust that origin, Squid does not. Squid refuses
to fetch from it, and the sidecars, which take any failure of the parent as a reason to
go to the origin, still download it.

With parentCache.tls the sidecars' parent is Squid's https_port: its certificate, from a
trustme CA for the name the chart documents (`*.<fullname>-parent.<namespace>.svc`), is
the Secret the chart mounts, and that CA is in a ConfigMap of its own (parentCache.ca),
which the sidecars trust for the parent only (--parent-ca): the origins' CA ConfigMap
never holds it.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trustme
import yaml

from injector import names
from tests.chart import helmchart
from tests.image.conftest import Images
from tests.image.dockerd import Docker
from tests.image.dockerpod import DockerPod
from tests.image.injected import (
    admin_port_of,
    origin_requests,
    plain_pod,
    render,
    sidecar_of,
    start_origin,
)

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.timeout(1800)]

APP_IMAGE = "debian:trixie"
HOST = "datasets.test"  # its CA is Squid's too
NEW_HOST = "new-datasets.test"  # its CA only the sidecars'
ORIGIN_CA_CONFIG_MAP = "origin-ca"
PARENT_CA_CONFIG_MAP = "parent-ca"
PARENT = "burstbuffer-parent"  # the chart's Squid objects (release "burstbuffer")
PARENT_TLS_SECRET = "parent-tls"
DATA_SIZE = 2 * 2**20 + 123


def chart_values(tls: bool) -> dict[str, Any]:
    parent_cache = {"enabled": True, "replicas": 1, "cacheSizeGi": 1}
    if tls:
        parent_cache["tls"] = {"enabled": True, "secretName": PARENT_TLS_SECRET}
        parent_cache["ca"] = {"configMapName": PARENT_CA_CONFIG_MAP, "key": "ca.crt"}
    return {
        "parentCache": parent_cache,
        "sidecar": {
            "intercept": [HOST, NEW_HOST],
            "upstreamCA": {"configMapName": ORIGIN_CA_CONFIG_MAP, "key": "ca.crt"},
        },
    }


def replica_pod(statefulset: dict[str, Any], ordinal: int) -> dict[str, Any]:
    """The pod the StatefulSet controller makes for replica `ordinal`."""
    name = statefulset["metadata"]["name"]
    template = statefulset["spec"]["template"]
    spec = dict(template["spec"])
    claims = [
        {
            "name": claim["metadata"]["name"],
            "persistentVolumeClaim": {"claimName": f"{claim['metadata']['name']}-{name}-{ordinal}"},
        }
        for claim in statefulset["spec"].get("volumeClaimTemplates") or []
    ]
    spec["volumes"] = [*spec.get("volumes", []), *claims]
    spec["hostname"] = f"{name}-{ordinal}"
    metadata = {"name": f"{name}-{ordinal}", "namespace": statefulset["metadata"]["namespace"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def through_squid(
    address: str, port: int, url: str, tls: ssl.SSLContext | None, server_hostname: str
) -> tuple[int, dict[str, str]]:
    """A GET of `url` (absolute-form, as a sidecar sends it) to Squid's listener at
    `address`:`port`, over TLS verified for `server_hostname` if `tls`: (status, headers)."""
    connection = http.client.HTTPConnection(address, port, timeout=30)
    sock = socket.create_connection((address, port), timeout=30)
    connection.sock = tls.wrap_socket(sock, server_hostname=server_hostname) if tls else sock
    try:
        connection.request("GET", url)
        response = connection.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    finally:
        connection.close()


def run_pod(
    docker: Docker,
    rendered: dict[str, Any],
    images: Images,
    workdir: Path,
    expected: bytes,
    **pod_options: Any,
) -> dict[str, Any]:
    """Run an injected pod whose app writes /out/data.bin and /out/new.bin; check both
    are `expected` and return its sidecar's /stats."""
    sidecar = sidecar_of(rendered)
    admin_port = admin_port_of(sidecar)
    pod = DockerPod(
        docker,
        rendered,
        images={sidecar["image"]: images.burstbuffer, APP_IMAGE: images.app},
        sandbox_image=images.base,
        workdir=workdir,
        **pod_options,
    )
    with pod:
        pod.start(timeout=120)
        code = pod.wait("app", timeout=120)
        assert code == 0, pod.logs("app") + pod.logs(names.CONTAINER)
        assert pod.volume_file("out", "data.bin").read_bytes() == expected
        assert pod.volume_file("out", "new.bin").read_bytes() == expected
        return pod.stats(admin_port)


def test_the_image_runs_squid_with_openssl_as_a_user_and_holds_no_key(
    docker: Docker, squid_image: str
) -> None:
    inspected = json.loads(docker.run("image", "inspect", squid_image).stdout)[0]
    assert inspected["Config"]["User"] == "13:13"
    version = docker.run("run", "--rm", "--entrypoint", "squid", squid_image, "-v").stdout
    assert b"--with-openssl" in version and b"--with-gnutls" not in version, version
    script = (
        "find / -xdev -type f -perm /6000;"
        " grep -rlI -e 'PRIVATE KEY' /etc /usr/share/squid /var /opt /root /home"
    )
    found = docker.run(
        "run", "--rm", "--user", "0", "--entrypoint", "sh", squid_image, "-c", script,
        check=False, timeout=120,
    )  # fmt: skip
    assert found.stdout == b"", found.stdout.decode()  # no setuid file, no private key


@pytest.mark.parametrize("tls", [False, True], ids=["http-parent", "https-parent"])
def test_the_charts_squid_serves_the_second_pod_and_refuses_an_unverified_origin(
    tls: bool,
    docker: Docker,
    images: Images,
    squid_image: str,
    network: tuple[str, str],
    origin_ca: trustme.CA,
    tmp_path: Path,
) -> None:
    network_name, node_ip = network
    data = random.Random(7).randbytes(DATA_SIZE)
    new_ca = trustme.CA()
    origin, base = start_origin(node_ip, origin_ca, HOST, data, tmp_path / "origin")
    new_origin, new_base = start_origin(node_ip, new_ca, NEW_HOST, data, tmp_path / "new")
    url = f"https://{HOST}:{base.rsplit(':', 1)[1]}/files/data.bin"
    new_url = f"https://{NEW_HOST}:{new_base.rsplit(':', 1)[1]}/files/data.bin"
    hosts = {HOST: node_ip, NEW_HOST: node_ip}

    documents = helmchart.render(chart_values(tls))
    statefulset = helmchart.one(documents, "StatefulSet", PARENT)
    squid_conf = helmchart.one(documents, "ConfigMap", PARENT)["data"]
    (parent_url,) = helmchart.injector_config(documents)["parents"]
    parent = urlsplit(parent_url)
    assert parent.scheme == ("https" if tls else "http"), parent_url
    assert parent.hostname is not None and parent.port is not None, parent_url
    squid_container = statefulset["spec"]["template"]["spec"]["containers"][0]
    squid_image_name = squid_container["image"]
    # The origins' CA ConfigMap holds theirs only; with TLS the parent's has its own.
    parent_ca = trustme.CA() if tls else None
    parent_ca_pem = parent_ca.cert_pem.bytes() if parent_ca else b""
    secrets = {}
    listener = None
    if parent_ca:
        # The certificate the chart asks for: *.<fullname>-parent.<namespace>.svc.
        cert = parent_ca.issue_cert(f"*.{PARENT}.{helmchart.NAMESPACE}.svc")
        secrets[PARENT_TLS_SECRET] = {
            "tls.crt": cert.cert_chain_pems[0].bytes().decode(),
            "tls.key": cert.private_key_pem.bytes().decode(),
        }
        listener = ssl.create_default_context(cadata=parent_ca_pem.decode())
    squid = DockerPod(
        docker,
        replica_pod(statefulset, 0),
        images={squid_image_name: squid_image},
        sandbox_image=images.base,
        workdir=tmp_path / "squid",
        config_maps={
            PARENT: squid_conf,
            ORIGIN_CA_CONFIG_MAP: {"ca.crt": origin_ca.cert_pem.bytes().decode()},
        },
        secrets=secrets,
        hosts=hosts,
        network=network_name,
    )
    all_cas = (origin_ca.cert_pem.bytes() + new_ca.cert_pem.bytes()).decode()
    pod_config_maps = {ORIGIN_CA_CONFIG_MAP: {"ca.crt": all_cas}}
    if parent_ca:
        pod_config_maps[PARENT_CA_CONFIG_MAP] = {"ca.crt": parent_ca_pem.decode()}
    config = yaml.safe_dump(helmchart.injector_config(documents))
    try:
        with squid:
            squid.start(timeout=120)
            squid.await_probe("squid", "readinessProbe", timeout=60)
            # Squid verifies origins against the CA it was given, and only against it;
            # asked on the sidecars' listener (with TLS: its certificate verified for
            # the name the sidecars use).
            status, headers = through_squid(
                squid.pod_ip, parent.port, new_url, listener, parent.hostname
            )
            assert status == 503 and headers.get("X-Squid-Error", "").startswith(
                "ERR_SECURE_CONNECT_FAIL"
            ), (status, headers, squid.logs("squid"))
            assert origin_requests(new_base, tmp_path / "new" / "origin-ca.pem") == {}

            script = (
                f"curl -sS --fail -o /out/data.bin {url}"
                f" && curl -sS --fail -o /out/new.bin {new_url}"
            )
            for number in (1, 2):
                pod = plain_pod(f"train-{number}", f"{HOST},{NEW_HOST}", script, APP_IMAGE)
                rendered = render(pod, config, tmp_path)
                args = sidecar_of(rendered)["args"]
                assert args[args.index("--parent") + 1] == parent_url, args
                # With TLS the parent's CA is --parent-ca: trusted for the parent alone.
                assert ("--parent-ca" in args) == tls and "--upstream-ca" in args, args
                stats = run_pod(
                    docker,
                    rendered,
                    images,
                    tmp_path / f"pod-{number}",
                    config_maps=pod_config_maps,
                    hosts={**hosts, parent.hostname: squid.pod_ip},
                    network=network_name,
                    expected=data,
                )
                assert stats["misses"] == 2 and stats["parent_requests"] == 2, stats
                # The refused object is the parent's one failure; the origin served it.
                assert sum(stats["parent_failures"].values()) == 1, stats

            # The origin Squid trusts served its object once: Squid served the second pod.
            assert origin_requests(base, tmp_path / "origin" / "origin-ca.pem") == {
                "/files/data.bin": 1
            }
            # The other origin served each pod itself, and never Squid.
            assert origin_requests(new_base, tmp_path / "new" / "origin-ca.pem") == {
                "/files/data.bin": 2
            }
            log = docker.run("logs", squid.container_name("squid")).stdout.decode()
            codes = [line.split()[3] for line in log.splitlines() if url in line]
            assert len(codes) == 2 and codes[0].startswith("TCP_MISS/200"), log
            assert "HIT/200" in codes[1], log
            # Squid ran as the chart says, not as the image defaults.
            inspected = json.loads(docker.run("inspect", squid.container_name("squid")).stdout)[0]
            assert inspected["Config"]["User"] == "13:13"
            assert inspected["HostConfig"]["ReadonlyRootfs"] is True
            assert inspected["HostConfig"]["CapDrop"] == ["ALL"]
            squid.await_probe("squid", "livenessProbe", timeout=60)
    finally:
        for process in (origin, new_origin):
            process.terminate()
            process.wait(10)
