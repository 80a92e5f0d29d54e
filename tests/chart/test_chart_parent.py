"""The parent cache tier in the chart: Squid's StatefulSet, its squid.conf, and the
sidecars' --parent, rendered with the real Helm engine."""

from __future__ import annotations

import re
from typing import Any

from helmchart import NAMESPACE, SCENARIOS, injector_config, of_kind, one, render

PARENT = "burstbuffer-parent"


def squid_conf(documents: list[dict[str, Any]]) -> list[str]:
    text: str = one(documents, "ConfigMap", PARENT)["data"]["squid.conf"]
    return text.splitlines()


def directive(lines: list[str], name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in lines if line.split(None, 1)[:1] == [name]]


def test_no_parent_tier_by_default() -> None:
    documents = render()
    assert injector_config(documents)["parents"] == []
    assert of_kind(documents, "StatefulSet") == []


def test_squid_runs_as_a_statefulset_with_a_volume_per_replica() -> None:
    documents = render(SCENARIOS["parent-cache"])
    statefulset = one(documents, "StatefulSet", PARENT)
    service = one(documents, "Service", PARENT)
    assert statefulset["spec"]["replicas"] == 3
    assert statefulset["spec"]["serviceName"] == PARENT
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == statefulset["spec"]["selector"]["matchLabels"]
    assert {p["port"] for p in service["spec"]["ports"]} == {3128, 3129}
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "111Gi"  # 100 GiB + 10%
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (squid,) = pod["containers"]
    assert squid["image"] == "ghcr.io/burstbuffer/squid:6.13"
    assert squid["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "parent-tls"
    assert volumes["upstream-ca"]["configMap"]["name"] == "corp-root-ca"


def test_squid_conf_comes_from_values() -> None:
    lines = squid_conf(render(SCENARIOS["parent-cache"]))
    assert directive(lines, "cache_dir") == ["ufs /var/spool/squid 102400 16 256"]
    assert directive(lines, "maximum_object_size") == ["64 GB"]
    assert directive(lines, "https_port")[0].startswith("3129 tls-cert=")
    assert directive(lines, "tls_outgoing_options") == [
        "cafile=/etc/ssl/certs/ca-certificates.crt",
        "cafile=/etc/squid/upstream-ca/ca.crt",
    ]
    for needed in ("range_offset_limit -1", "collapsed_forwarding on", "http_access deny all"):
        assert needed in lines
    plain = squid_conf(render({"parentCache": {"enabled": True, "maximumObjectSize": "2 GB"}}))
    assert directive(plain, "https_port") == [] and directive(plain, "maximum_object_size") == [
        "2 GB"
    ]
    assert directive(plain, "tls_outgoing_options") == ["cafile=/etc/ssl/certs/ca-certificates.crt"]


def test_squid_forwards_only_to_the_intercepted_hosts() -> None:
    values = {"parentCache": {"enabled": True}, "sidecar": {"intercept": ["a.org", "*.s3.*.x.com"]}}
    (acl,) = [line for line in squid_conf(render(values)) if line.startswith("acl intercepted")]
    patterns = [re.compile(p, re.IGNORECASE) for p in acl.split()[3:]]

    def allowed(host: str) -> bool:
        return any(p.search(host) for p in patterns)

    assert allowed("a.org") and allowed("bucket.s3.eu-west-1.x.com")
    assert not allowed("xa.org") and not allowed("a.org.evil.net") and not allowed("s3.x.com")


def test_every_sidecar_gets_one_parent_per_replica() -> None:
    parents = injector_config(render(SCENARIOS["parent-cache"]))["parents"]
    assert parents == [f"https://{PARENT}-{i}.{PARENT}.{NAMESPACE}.svc:3129" for i in range(3)]
    plain = injector_config(render({"parentCache": {"enabled": True, "replicas": 1}}))
    assert plain["parents"] == [f"http://{PARENT}-0.{PARENT}.{NAMESPACE}.svc:3128"]


def test_an_existing_cache_is_named_by_url() -> None:
    documents = render(SCENARIOS["parent-cache-url"])
    assert injector_config(documents)["parents"] == ["http://squid.cache.svc:3128"]
    assert of_kind(documents, "StatefulSet") == []
