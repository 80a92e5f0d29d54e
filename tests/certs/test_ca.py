import datetime
import logging
import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import OpenSSL
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mitmproxy.certs import CertStore

from certs.ca import (
    CA_CERT_FILE,
    CA_FILE,
    DHPARAM_FILE,
    CAError,
    PodCA,
    load_or_create_ca,
    write_atomically,
)

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def snapshot(directory: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file in `directory`: (inode, mtime in ns, content)."""
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(directory.iterdir())
    }


def pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def test_first_start_creates_a_private_ca(tmp_path: Path) -> None:
    ca_dir = tmp_path / "deep" / "ca"
    ca = load_or_create_ca(ca_dir)

    assert mode(ca_dir) == 0o700
    assert {p.name: mode(p) for p in ca_dir.iterdir()} == {
        CA_FILE: 0o600,
        CA_CERT_FILE: 0o644,
        DHPARAM_FILE: 0o644,
    }
    raw = (ca_dir / CA_FILE).read_bytes()
    assert raw.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert raw.endswith(ca.cert_pem)
    assert (ca_dir / CA_CERT_FILE).read_bytes() == ca.cert_pem

    assert isinstance(ca.key, ec.EllipticCurvePrivateKey)
    assert isinstance(ca.key.curve, ec.SECP256R1)
    cert = ca.cert
    assert cert.subject == cert.issuer
    assert ca.name.startswith("burstbuffer pod CA ")
    assert ca.name in cert.subject.rfc4514_string()
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign
    assert not usage.value.digital_signature
    ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    assert ski.value == x509.SubjectKeyIdentifier.from_public_key(ca.key.public_key())
    now = datetime.datetime.now(datetime.UTC)
    assert now - datetime.timedelta(days=2) < cert.not_valid_before_utc < now
    assert cert.not_valid_after_utc - now > datetime.timedelta(days=9 * 365)


def test_mitmproxy_loads_it_without_writing_anything(tmp_path: Path) -> None:
    ca = load_or_create_ca(tmp_path / "ca")
    before = snapshot(tmp_path / "ca")

    store = CertStore.from_store(tmp_path / "ca", "mitmproxy", 2048)

    assert snapshot(tmp_path / "ca") == before
    assert store.default_ca.to_cryptography() == ca.cert
    assert store.default_privatekey.public_key() == ca.key.public_key()
    assert store.dhparams != OpenSSL.SSL._ffi.NULL
    leaf = store.get_cert("data.example.org", [x509.DNSName("data.example.org")])
    leaf.cert.to_cryptography().verify_directly_issued_by(ca.cert)
    assert leaf.privatekey.public_key() == ca.key.public_key()  # mitmproxy reuses the CA key


def test_restart_reuses_the_ca_untouched(tmp_path: Path) -> None:
    first = load_or_create_ca(tmp_path / "ca")
    before = snapshot(tmp_path / "ca")

    second = load_or_create_ca(tmp_path / "ca")

    assert snapshot(tmp_path / "ca") == before
    assert second.cert == first.cert
    assert pem(second.key) == pem(first.key)


def test_two_pods_get_different_cas(tmp_path: Path) -> None:
    one, two = load_or_create_ca(tmp_path / "one"), load_or_create_ca(tmp_path / "two")
    assert one.cert.subject != two.cert.subject
    assert one.fingerprint != two.fingerprint
    assert one.key.public_key() != two.key.public_key()


def test_a_ca_made_by_mitmproxy_itself_is_reused(tmp_path: Path) -> None:
    CertStore.create_store(tmp_path, "mitmproxy", 2048)
    before = snapshot(tmp_path)

    ca = load_or_create_ca(tmp_path)

    assert snapshot(tmp_path) == before
    assert isinstance(ca.key, rsa.RSAPrivateKey)
    assert ca.name == "mitmproxy"


def test_an_existing_open_directory_is_made_private(tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    ca_dir.mkdir(mode=0o755)
    ca_dir.chmod(0o755)
    load_or_create_ca(ca_dir)
    assert mode(ca_dir) == 0o700


def test_the_key_is_never_printed_or_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        ca = load_or_create_ca(tmp_path / "ca")
        load_or_create_ca(tmp_path / "ca")
    key_text = pem(ca.key).decode()
    secret = str(ca.key.private_numbers().private_value)
    for text in (repr(ca), str(ca), caplog.text):
        assert "PRIVATE" not in text
        assert secret not in text
        assert key_text.splitlines()[1] not in text
    assert ca.fingerprint in caplog.text  # the log names the CA, by its certificate


def _other_ca(tmp_path: Path) -> PodCA:
    return load_or_create_ca(tmp_path / "other")


def _expired_ca(key: ec.EllipticCurvePrivateKey) -> bytes:
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "expired")])
    long_ago = datetime.datetime(2001, 1, 1, tzinfo=datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(long_ago)
        .not_valid_after(long_ago + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def _not_a_ca(key: ec.EllipticCurvePrivateKey) -> bytes:
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "leaf")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


# (what is done to a good CA directory, the file the error must name, words it must say)
Damage = Callable[[Path, PodCA, Path], None]
DAMAGES: list[tuple[str, Damage, str, str]] = [
    (
        "truncated",
        lambda d, ca, t: (d / CA_FILE).write_bytes((d / CA_FILE).read_bytes()[:200]),
        CA_FILE,
        "private key",
    ),
    ("empty", lambda d, ca, t: (d / CA_FILE).write_bytes(b""), CA_FILE, "private key"),
    ("garbage", lambda d, ca, t: (d / CA_FILE).write_bytes(b"\x00" * 64), CA_FILE, "private key"),
    ("key only", lambda d, ca, t: (d / CA_FILE).write_bytes(pem(ca.key)), CA_FILE, "certificate"),
    (
        "broken certificate",
        lambda d, ca, t: (d / CA_FILE).write_bytes(
            pem(ca.key) + b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
        ),
        CA_FILE,
        "certificate",
    ),
    (
        "two certificates",
        lambda d, ca, t: (d / CA_FILE).write_bytes(pem(ca.key) + ca.cert_pem + ca.cert_pem),
        CA_FILE,
        "2 certificates",
    ),
    (
        "another CA's key",
        lambda d, ca, t: (d / CA_FILE).write_bytes(pem(_other_ca(t).key) + ca.cert_pem),
        CA_FILE,
        "do not belong together",
    ),
    (
        "encrypted key",
        lambda d, ca, t: (d / CA_FILE).write_bytes(
            ca.key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"secret"),
            )
            + ca.cert_pem
        ),
        CA_FILE,
        "unencrypted",
    ),
    (
        "not a CA",
        lambda d, ca, t: (d / CA_FILE).write_bytes(pem(ca.key) + _not_a_ca(ca.key)),
        CA_FILE,
        "not a CA",
    ),
    (
        "expired",
        lambda d, ca, t: (d / CA_FILE).write_bytes(pem(ca.key) + _expired_ca(ca.key)),
        CA_FILE,
        "expired on 2001-01-02",
    ),
    ("cert file missing", lambda d, ca, t: (d / CA_CERT_FILE).unlink(), CA_CERT_FILE, "missing"),
    (
        "cert file of another CA",
        lambda d, ca, t: (d / CA_CERT_FILE).write_bytes(_other_ca(t).cert_pem),
        CA_CERT_FILE,
        "does not hold",
    ),
    (
        "cert file garbage",
        lambda d, ca, t: (d / CA_CERT_FILE).write_bytes(b"junk"),
        CA_CERT_FILE,
        "does not hold",
    ),
    ("dhparam missing", lambda d, ca, t: (d / DHPARAM_FILE).unlink(), DHPARAM_FILE, "missing"),
    (
        "dhparam garbage",
        lambda d, ca, t: (d / DHPARAM_FILE).write_bytes(b"-----BEGIN DH PARAMETERS-----\nx\n"),
        DHPARAM_FILE,
        "DH parameters",
    ),
]


@pytest.mark.parametrize(
    ("damage", "culprit", "words"),
    [case[1:] for case in DAMAGES],
    ids=[case[0] for case in DAMAGES],
)
def test_a_damaged_ca_is_a_clear_error_and_is_left_alone(
    tmp_path: Path, damage: Damage, culprit: str, words: str
) -> None:
    ca_dir = tmp_path / "ca"
    ca = load_or_create_ca(ca_dir)
    damage(ca_dir, ca, tmp_path)
    before = snapshot(ca_dir)

    with pytest.raises(CAError) as error:
        load_or_create_ca(ca_dir)

    message = str(error.value)
    assert str(ca_dir / culprit) in message
    assert words in message
    assert "delete the pod" in message
    assert snapshot(ca_dir) == before


def test_an_unwritable_place_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(CAError, match="cannot create the CA directory"):
        load_or_create_ca(tmp_path / "file" / "ca")


def test_a_creation_cut_short_is_completed_on_the_next_start(tmp_path: Path) -> None:
    # What a kill between the first writes leaves: no key file, other files, a temp file.
    ca_dir = tmp_path / "ca"
    ca_dir.mkdir(mode=0o700)
    (ca_dir / DHPARAM_FILE).write_bytes(b"half")
    (ca_dir / CA_CERT_FILE).write_bytes(_other_ca(tmp_path).cert_pem)
    (ca_dir / f".{CA_FILE}.abc123.tmp").write_bytes(b"-----BEGIN PRIVATE KEY-----\npart")

    ca = load_or_create_ca(ca_dir)

    assert sorted(p.name for p in ca_dir.iterdir()) == sorted([CA_FILE, CA_CERT_FILE, DHPARAM_FILE])
    assert (ca_dir / CA_CERT_FILE).read_bytes() == ca.cert_pem
    assert load_or_create_ca(ca_dir).cert == ca.cert


CREATE_FOREVER = """
import itertools, sys
from pathlib import Path
from certs.ca import load_or_create_ca
base = Path(sys.argv[1])
for i in itertools.count():
    load_or_create_ca(base / str(i))
    print(i, flush=True)
"""


@pytest.mark.parametrize("seed", range(8))
def test_a_kill_during_creation_never_leaves_a_broken_ca(tmp_path: Path, seed: int) -> None:
    """SIGKILL a process that creates CA after CA; every directory it touched must load.

    One creation takes a few milliseconds; killing at a random moment of up to 4 ms after
    a completed one lands between or inside the file writes (a temporary file, some
    files without the key file, ...), a different point for each seed.
    """
    creator = subprocess.Popen(
        [sys.executable, "-c", CREATE_FOREVER, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert creator.stdout is not None
        for _ in range(3):  # warm: imports done, creations under way
            assert creator.stdout.readline(), "the creating process died"
        time.sleep(random.Random(seed).uniform(0, 0.004))
    finally:
        creator.send_signal(signal.SIGKILL)
        creator.wait(timeout=30)
        if creator.stdout:
            creator.stdout.close()
    touched = sorted(tmp_path.iterdir())
    assert len(touched) >= 3
    for ca_dir in touched:
        ca = load_or_create_ca(ca_dir)
        assert load_or_create_ca(ca_dir).cert == ca.cert
        assert sorted(p.name for p in ca_dir.iterdir()) == [CA_CERT_FILE, CA_FILE, DHPARAM_FILE]


@pytest.mark.parametrize(("file_mode", "umask"), [(0o600, 0o000), (0o644, 0o077), (0o644, 0o022)])
def test_write_atomically_sets_the_mode_whatever_the_umask(
    tmp_path: Path, file_mode: int, umask: int
) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"old")
    old_umask = os.umask(umask)
    try:
        write_atomically(target, b"new", file_mode)
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"new"
    assert mode(target) == file_mode
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_write_atomically_keeps_the_old_file_when_it_fails(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomically(target, "not bytes", 0o644)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["file"]
