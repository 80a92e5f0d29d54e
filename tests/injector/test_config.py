from pathlib import Path

import pytest
import yaml

from injector import settings
from injector.quantity import format_bytes, parse_bytes, parse_quantity
from injector.settings import ConfigError, InjectorSettings
from sidecar import settings as sidecar_settings
from sidecar.proxy import listeners as sidecar_listeners
from sidecar.settings import DEFAULT_INTERCEPT


def test_defaults_are_the_documented_ones() -> None:
    s = InjectorSettings()
    assert s.image == "ghcr.io/burstbuffer/burstbuffer:0.1.0"
    assert s.native_sidecar and s.capture == "proxy-env"
    assert (s.proxy_port, s.admin_port, s.run_as_user) == (3128, 3129, 65532)
    assert (s.buffer.size, s.buffer.medium, s.buffer.eviction) == (2**30, "Memory", "none")
    assert s.intercept == DEFAULT_INTERCEPT
    assert s.trust.bundle_paths[0] == "/etc/ssl/certs/ca-certificates.crt"
    assert dict(s.resources.limits) == {"memory": "256Mi"}
    assert not s.prometheus_annotations
    assert (s.upstream_ca.config_map_name, s.upstream_ca.key) == ("", "ca.crt")
    # The sidecar's own default, so that a pod without the flag and one with it agree.
    assert s.transparent_port == sidecar_settings.defaults()["transparent_port"]


def test_the_hostaliases_ports_are_the_sidecars() -> None:
    assert sorted(settings.HOSTALIASES_PORTS) == sorted(
        (sidecar_listeners.HOSTALIASES_HTTP_PORT, sidecar_listeners.HOSTALIASES_TLS_PORT)
    )


def test_document_round_trip() -> None:
    document = settings.to_document(InjectorSettings())
    assert document["buffer"] == {
        "size": "1Gi",
        "medium": "Memory",
        "eviction": "none",
        "pmem": {"storageClassName": "", "hostPath": ""},
    }
    assert settings.load(yaml.safe_dump(document)) == InjectorSettings()
    assert settings.load("") == InjectorSettings()
    assert settings.load_file(None) == InjectorSettings()


def test_partial_document_keeps_other_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("buffer:\n  size: 4Gi\n  medium: Disk\nnoProxy: [.corp.example, 10.1.2.3]\n")
    s = settings.load_file(path)
    assert s.buffer.size == 4 * 2**30 and s.buffer.medium == "Disk"
    assert s.buffer.eviction == "none" and s.image == settings.DEFAULT_IMAGE
    assert s.no_proxy == (".corp.example", "10.1.2.3")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("imagePulPolicy: Always", "imagePulPolicy: unknown key"),
        ("buffer: {sise: 1Gi}", "buffer.sise: unknown key"),
        ("buffer: {pmem: {hostpath: /x}}", "buffer.pmem.hostpath: unknown key"),
        ("buffer: {medium: pmem}", "buffer.pmem: medium pmem needs exactly one"),
        ("buffer: {medium: memory}", "buffer.medium: expected one of Memory, Disk, pmem"),
        ("buffer: {size: 1Mi}", "below the minimum 32Mi"),
        ("buffer: {size: lots}", "buffer.size: invalid quantity"),
        ("buffer: {eviction: fifo}", "buffer.eviction: invalid eviction policy"),
        ('proxyPort: "3128"', "proxyPort: expected an integer"),
        ("adminPort: 3128", "adminPort: 3128 is also the proxyPort"),
        ("runAsUser: 0", "runAsUser: expected 1..2147483647"),
        ("nativeSidecar: maybe", "nativeSidecar: expected true or false"),
        ("capture: sidecar", "capture: expected one of proxy-env, hostAliases, transparent"),
        ("capture: hostaliases", "capture: expected one of proxy-env, hostAliases"),
        ("transparentPort: 3129", "transparentPort: 3129 is also the proxyPort or adminPort"),
        ("transparentPort: 443", "transparentPort: 443 is taken by the hostAliases capture"),
        ("proxyPort: 80", "proxyPort: 80 is taken by the hostAliases capture"),
        ("prometheusAnnotations: on-demand", "prometheusAnnotations: expected true or false"),
        ("upstreamCA: {configMapName: Corp_CA}", "upstreamCA.configMapName: invalid object name"),
        ("upstreamCA: {key: a/b}", "upstreamCA.key: invalid ConfigMap key"),
        ("upstreamCA: {key: ..}", "upstreamCA.key: invalid ConfigMap key"),
        ("upstreamCA: {name: x}", "upstreamCA.name: unknown key"),
        ("parentCA: {configMapName: parent-ca}", "parentCA: no https:// parent to trust it for"),
        (
            "parents: [http://p:3128]\nparentCA: {configMapName: parent-ca}",
            "parentCA: no https:// parent to trust it for",
        ),
        ("intercept: [https://a.org]", "intercept: invalid host pattern"),
        ("intercept: a.org", "intercept: expected a list"),
        ("httpFreshness: [pypi.org/simple]", "httpFreshness: invalid host pattern"),
        ("httpFreshness: pypi.org", "httpFreshness: expected a list"),
        ("noProxy: [10.0.0.0/8]", "noProxy: invalid no_proxy entry '10.0.0.0/8': wget"),
        ("trust: {mountPath: etc/x}", "trust.mountPath: expected a normalized absolute path"),
        ("trust: {bundlePaths: [/etc/burstbuffer/trust/x]}", "lies inside trust.mountPath"),
        ("resources: {limits: {memory: 1Gx}}", "resources.limits: memory: invalid quantity"),
        ("resources: {requests: {memory: 1Gi}}", "resources.requests.memory: 1Gi exceeds"),
        ("resources: [1]", "resources: expected a mapping"),
        ("[1, 2]", "config: expected a mapping"),
        ("a: [", "config: not valid YAML"),
    ],
)
def test_invalid_documents_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        settings.load(text)


@pytest.mark.parametrize("capture", sidecar_settings.CAPTURE_MODES)
def test_every_capture_mode_is_accepted(capture: str) -> None:
    assert settings.load(f"capture: {capture}").capture == capture


def test_new_keys_round_trip() -> None:
    text = (
        "transparentPort: 15001\nprometheusAnnotations: true\n"
        "upstreamCA: {configMapName: corp-ca, key: bundle.pem}\n"
        "httpFreshness: [PyPI.org, '*.hf.co']\n"
    )
    s = settings.load(text)
    assert s.transparent_port == 15001 and s.prometheus_annotations
    assert s.http_freshness == ("pypi.org", "*.hf.co")
    assert (s.upstream_ca.config_map_name, s.upstream_ca.key) == ("corp-ca", "bundle.pem")
    assert settings.load(yaml.safe_dump(settings.to_document(s))) == s


def test_pmem_sources() -> None:
    s = settings.load("buffer: {medium: pmem, pmem: {storageClassName: pmem-csi-sc}}")
    assert s.buffer.pmem.storage_class_name == "pmem-csi-sc"
    with pytest.raises(ConfigError, match="exactly one"):
        settings.load("buffer: {medium: pmem, pmem: {storageClassName: sc, hostPath: /mnt/pmem}}")


@pytest.mark.parametrize(
    ("text", "value"),
    [("128Mi", 128 * 2**20), ("1.5G", 1_500_000_000), ("100m", 0.1), ("1e3", 1000), (5, 5)],
)
def test_quantities(text: str | int, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "1GB", "Gi", "1.2.3", "1 Gi", "--1", "1e99"])
def test_bad_quantities(text: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity(text)


def test_byte_spellings_round_trip() -> None:
    for size in (1, 999, 1000, 1024, 3 * 2**20, 2**30, 10**9, 5 * 2**40 + 1):
        assert parse_bytes(format_bytes(size)) == size
    assert format_bytes(2**30) == "1Gi" and format_bytes(10**9) == "1G"
    assert parse_bytes("100m") == 1  # a fraction of a byte rounds up
