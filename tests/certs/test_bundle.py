import os
import ssl
import stat
import warnings
from pathlib import Path

import certifi
import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.utils import CryptographyDeprecationWarning

from certs.bundle import (
    BUNDLE_FILE,
    CA_CERT_FILE,
    TRUST_FILES,
    TRUST_STORE_FILE,
    TrustError,
    public_roots_pem,
    read_upstream_ca,
    upstream_trust_pem,
    write_private,
    write_trust_files,
)
from certs.ca import PodCA, load_or_create_ca

HOST = "data.example.org"


@pytest.fixture
def pod_ca(tmp_path: Path) -> PodCA:
    return load_or_create_ca(tmp_path / "ca")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def identity(path: Path) -> tuple[int, int, bytes]:
    return path.stat().st_ino, path.stat().st_mtime_ns, path.read_bytes()


def origin_server(ca: trustme.CA, host: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(host).configure_cert(context)
    return context


def certificates(pem: bytes) -> list[bytes]:
    """The PEM blocks of a bundle, unparsed: certifi's roots include one that cryptography
    warns about (a serial number of zero), and OpenSSL, which reads the bundle in real
    clients, takes it."""
    begin = b"-----BEGIN CERTIFICATE-----"
    return [begin + block for block in pem.split(begin)[1:]]


def last_certificates(pem: bytes, count: int) -> list[x509.Certificate]:
    return [x509.load_pem_x509_certificate(block) for block in certificates(pem)[-count:]]


def test_trust_files_hold_the_pod_ca_and_the_public_roots(
    tmp_path: Path, pod_ca: PodCA, origin_ca: trustme.CA
) -> None:
    trust = tmp_path / "trust"
    write_trust_files(trust, pod_ca.cert_pem, origin_ca.cert_pem.bytes())

    assert sorted(p.name for p in trust.iterdir()) == sorted(TRUST_FILES)
    assert mode(trust / CA_CERT_FILE) == mode(trust / BUNDLE_FILE) == 0o644
    assert (trust / CA_CERT_FILE).read_bytes() == pod_ca.cert_pem
    bundle = (trust / BUNDLE_FILE).read_bytes()
    assert bundle.startswith(Path(certifi.where()).read_bytes())
    assert len(certificates(bundle)) == len(certificates(public_roots_pem())) + 2
    origin_cert = x509.load_pem_x509_certificate(origin_ca.cert_pem.bytes())
    assert last_certificates(bundle, 2) == [pod_ca.cert, origin_cert]
    for path in trust.iterdir():
        assert b"PRIVATE KEY" not in path.read_bytes()


def test_the_trust_store_holds_the_bundle_as_trusted_entries_without_a_password(
    tmp_path: Path, pod_ca: PodCA, origin_ca: trustme.CA
) -> None:
    trust = tmp_path / "trust"
    write_trust_files(trust, pod_ca.cert_pem, origin_ca.cert_pem.bytes())
    assert mode(trust / TRUST_STORE_FILE) == 0o644

    store = trust_store_of(trust / TRUST_STORE_FILE)
    assert store.key is None and store.cert is None
    bundle = parsed((trust / BUNDLE_FILE).read_bytes())
    assert [entry.certificate for entry in store.additional_certs] == bundle
    names = {entry.friendly_name for entry in store.additional_certs}
    assert len(names) == len(bundle)  # JVM aliases are unique


def parsed(pem: bytes) -> list[x509.Certificate]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)  # a certifi root
        return x509.load_pem_x509_certificates(pem)


def trust_store_of(path: Path) -> pkcs12.PKCS12KeyAndCertificates:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        return pkcs12.load_pkcs12(path.read_bytes(), None)


def test_a_missing_trust_store_is_added_from_the_bundle_left_in_place(
    tmp_path: Path, pod_ca: PodCA
) -> None:
    trust = tmp_path / "trust"
    write_trust_files(trust, pod_ca.cert_pem, None)
    (trust / TRUST_STORE_FILE).unlink()  # what a sidecar of an earlier version left
    before = {name: identity(trust / name) for name in (CA_CERT_FILE, BUNDLE_FILE)}

    write_trust_files(trust, pod_ca.cert_pem, None)

    assert {name: identity(trust / name) for name in (CA_CERT_FILE, BUNDLE_FILE)} == before
    store = trust_store_of(trust / TRUST_STORE_FILE)
    expected = parsed((trust / BUNDLE_FILE).read_bytes())
    assert [entry.certificate for entry in store.additional_certs] == expected


def test_a_leaf_mitmproxy_signs_verifies_against_the_trust_files(
    tmp_path: Path, pod_ca: PodCA, mitmproxy_leaf, client_context, handshake
) -> None:
    trust = tmp_path / "trust"
    write_trust_files(trust, pod_ca.cert_pem, None)
    server = mitmproxy_leaf(tmp_path / "ca", HOST)

    for trusted in (trust / BUNDLE_FILE, trust / CA_CERT_FILE):
        assert handshake(server, client_context(cafile=trusted), HOST) == b"hello from the server"
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(server, client_context(cafile=trust / BUNDLE_FILE), "other.example.org")


def test_another_pods_trust_files_refuse_the_leaf(
    tmp_path: Path, pod_ca: PodCA, mitmproxy_leaf, client_context, handshake
) -> None:
    other_pod = load_or_create_ca(tmp_path / "other-ca")
    write_trust_files(tmp_path / "other-trust", other_pod.cert_pem, None)
    server = mitmproxy_leaf(tmp_path / "ca", HOST)

    client = client_context(cafile=tmp_path / "other-trust" / BUNDLE_FILE)
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(server, client, HOST)


def test_the_bundle_still_verifies_upstream_ca_hosts(
    tmp_path: Path, pod_ca: PodCA, origin_ca: trustme.CA, client_context, handshake
) -> None:
    """A tunnelled private host (certificate from --upstream-ca) verifies with the bundle."""
    write_trust_files(tmp_path / "with", pod_ca.cert_pem, origin_ca.cert_pem.bytes())
    write_trust_files(tmp_path / "without", pod_ca.cert_pem, None)
    server = origin_server(origin_ca, "private.example.org")

    client = client_context(cafile=tmp_path / "with" / BUNDLE_FILE)
    assert handshake(server, client, "private.example.org")
    with pytest.raises(ssl.SSLCertVerificationError):
        client = client_context(cafile=tmp_path / "without" / BUNDLE_FILE)
        handshake(server, client, "private.example.org")


def test_a_restart_leaves_the_trust_files_untouched(
    tmp_path: Path, pod_ca: PodCA, origin_ca: trustme.CA
) -> None:
    trust = tmp_path / "trust"
    write_trust_files(trust, pod_ca.cert_pem, None)
    before = {name: identity(trust / name) for name in TRUST_FILES}

    restarted = load_or_create_ca(tmp_path / "ca")
    write_trust_files(trust, restarted.cert_pem, None)
    # Written once: even a changed --upstream-ca does not rewrite them (a new pod does).
    write_trust_files(trust, restarted.cert_pem, origin_ca.cert_pem.bytes())

    assert {name: identity(trust / name) for name in TRUST_FILES} == before
    assert sorted(p.name for p in trust.iterdir()) == sorted(TRUST_FILES)


def test_trust_files_of_another_ca_are_refused_and_kept(tmp_path: Path, pod_ca: PodCA) -> None:
    trust = tmp_path / "trust"
    lost = load_or_create_ca(tmp_path / "lost-ca")
    write_trust_files(trust, lost.cert_pem, None)
    before = {name: identity(trust / name) for name in TRUST_FILES}

    with pytest.raises(TrustError) as error:
        write_trust_files(trust, pod_ca.cert_pem, None)

    message = str(error.value)
    assert str(trust / CA_CERT_FILE) in message
    assert lost.fingerprint in message and pod_ca.name in message
    assert "CA directory was lost" in message and "delete the pod" in message
    assert {name: identity(trust / name) for name in TRUST_FILES} == before


def test_a_missing_bundle_is_written_beside_the_ca_file(tmp_path: Path, pod_ca: PodCA) -> None:
    trust = tmp_path / "trust"
    write_trust_files(trust, pod_ca.cert_pem, None)
    (trust / BUNDLE_FILE).unlink()
    ca_file = identity(trust / CA_CERT_FILE)

    write_trust_files(trust, pod_ca.cert_pem, None)

    assert identity(trust / CA_CERT_FILE) == ca_file
    assert last_certificates((trust / BUNDLE_FILE).read_bytes(), 1) == [pod_ca.cert]


def test_a_bundle_without_ca_file_is_rewritten(tmp_path: Path, pod_ca: PodCA) -> None:
    # What a kill between the two writes leaves, here from an earlier CA of the same pod.
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / BUNDLE_FILE).write_bytes(load_or_create_ca(tmp_path / "old").cert_pem)

    write_trust_files(trust, pod_ca.cert_pem, None)

    assert (trust / CA_CERT_FILE).read_bytes() == pod_ca.cert_pem
    assert last_certificates((trust / BUNDLE_FILE).read_bytes(), 1) == [pod_ca.cert]


def test_an_unreadable_ca_file_is_a_clear_error(tmp_path: Path, pod_ca: PodCA) -> None:
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / CA_CERT_FILE).write_bytes(b"not a certificate")
    with pytest.raises(TrustError, match=f"{trust / CA_CERT_FILE} holds no readable certificate"):
        write_trust_files(trust, pod_ca.cert_pem, None)


def test_an_unwritable_trust_file_is_a_clear_error(tmp_path: Path, pod_ca: PodCA) -> None:
    trust = tmp_path / "trust"
    (trust / BUNDLE_FILE).mkdir(parents=True)  # a directory where the bundle goes
    with pytest.raises(TrustError, match=f"cannot write the trust files into {trust}"):
        write_trust_files(trust, pod_ca.cert_pem, None)
    assert not (trust / CA_CERT_FILE).exists()


def test_upstream_trust_verifies_origins_from_the_extra_ca(
    origin_ca: trustme.CA, client_context, handshake
) -> None:
    server = origin_server(origin_ca, "origin.example.org")
    with_extra = upstream_trust_pem(origin_ca.cert_pem.bytes())

    assert len(certificates(with_extra)) == len(certificates(public_roots_pem())) + 1
    assert handshake(server, client_context(cadata=with_extra), "origin.example.org")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, client_context(cadata=upstream_trust_pem(None)), "origin.example.org")


def test_read_upstream_ca_keeps_only_certificates(tmp_path: Path, origin_ca: trustme.CA) -> None:
    mixed = tmp_path / "mixed.pem"
    leaf = origin_ca.issue_cert("a.example.org")
    mixed.write_bytes(
        b"some words\n"
        + leaf.private_key_pem.bytes()
        + origin_ca.cert_pem.bytes()
        + b"more words\n"
        + leaf.cert_chain_pems[0].bytes()
    )
    certificates = read_upstream_ca(mixed)
    assert b"PRIVATE KEY" not in certificates and b"words" not in certificates
    assert x509.load_pem_x509_certificates(certificates) == [
        x509.load_pem_x509_certificate(origin_ca.cert_pem.bytes()),
        x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()),
    ]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "holds no usable PEM certificates"),
        (b"just text\n", "holds no usable PEM certificates"),
        (None, "holds no usable PEM certificates"),  # a private key and nothing else
        (
            b"-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n",
            "holds no usable PEM certificates",
        ),
    ],
)
def test_a_bad_upstream_ca_file_is_a_clear_error(
    tmp_path: Path, origin_ca: trustme.CA, content: bytes | None, words: str
) -> None:
    path = tmp_path / "upstream.pem"
    path.write_bytes(content if content is not None else origin_ca.private_key_pem.bytes())
    with pytest.raises(TrustError, match=f"--upstream-ca {path} {words}"):
        read_upstream_ca(path)
    with pytest.raises(TrustError, match=f"--upstream-ca {words}"):
        upstream_trust_pem(path.read_bytes())
    pod_ca = load_or_create_ca(tmp_path / "ca")
    with pytest.raises(TrustError, match=f"--upstream-ca {words}"):
        write_trust_files(tmp_path / "trust", pod_ca.cert_pem, path.read_bytes())
    assert not (tmp_path / "trust").exists()


def test_a_missing_upstream_ca_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TrustError, match=f"--upstream-ca {tmp_path / 'nope.pem'}: cannot read"):
        read_upstream_ca(tmp_path / "nope.pem")


def test_write_private(tmp_path: Path) -> None:
    target = tmp_path / "upstream-trust.pem"
    write_private(target, b"first")
    inode = target.stat().st_ino
    write_private(target, b"second")
    assert target.read_bytes() == b"second"
    assert mode(target) == 0o600
    assert target.stat().st_ino != inode  # replaced by a rename, never written in place
    assert os.listdir(tmp_path) == ["upstream-trust.pem"]
