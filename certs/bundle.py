"""Trust files: the pod's (public roots + pod CA) and the sidecar's own (public roots).

The app containers trust files the sidecar writes into `--trust-dir`:

| file | mode | content |
| --- | --- | --- |
| `ca.crt` | 0644 | the pod CA certificate |
| `ca-bundle.crt` | 0644 | certifi's public roots, the pod CA, the `--upstream-ca` certificates |
| `ca-bundle.p12` | 0644 | the same certificates as a password-less PKCS12 trust store (the JVM) |

The bundle keeps the public roots and the `--upstream-ca` certificates because a client
pointed at it (`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, ...) uses it for every host, and
hosts that are not intercepted reach the client through a raw tunnel with their own
certificates. The CA key never goes there: only certificates, re-encoded from their
parsed form, are ever written.

The files are written once. App containers mount them by `subPath`, which pins the inode
they saw at start, so a restarted sidecar that finds both files for its own CA leaves them
untouched (same inode, same mtime). The bundles are written before `ca.crt`, so
`ca.crt` present means they are complete; a trust store missing beside them (a sidecar
of an older version wrote the directory) is made from the bundle that is there.

If `ca.crt` holds *another* CA, the CA directory was lost while the trust directory
survived (both should live and die with the pod). The running app containers trust only
the old CA, whose key is gone, so keeping the files breaks every new TLS connection and
replacing them breaks the containers that already read them: `write_trust_files()` refuses
with `TrustError`, and the pod has to be replaced.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import certifi
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.utils import CryptographyDeprecationWarning

from certs.ca import write_atomically

logger = logging.getLogger(__name__)

CA_CERT_FILE = "ca.crt"
BUNDLE_FILE = "ca-bundle.crt"
TRUST_STORE_FILE = "ca-bundle.p12"
TRUST_FILES = (CA_CERT_FILE, BUNDLE_FILE, TRUST_STORE_FILE)
# In the sidecar's private CA directory: what origins are verified against (public
# roots + --upstream-ca), written by the main process for every worker.
UPSTREAM_TRUST_FILE = "upstream-trust.pem"


class TrustError(Exception):
    """Trust files or extra CA certificates cannot be used as they are."""


def certificates_pem(data: bytes, source: str) -> bytes:
    """The PEM certificates in `data`, re-encoded one after the other; nothing else of it.

    Raises TrustError naming `source` when `data` holds no certificate or a broken one.
    A private key or any other text next to the certificates is left out.
    """
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise TrustError(f"{source} holds no usable PEM certificates ({e})") from e
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in certs)


def read_upstream_ca(path: Path) -> bytes:
    """The certificates of an `--upstream-ca` file (see `certificates_pem()`).

    Raises TrustError when the file cannot be read or holds no certificates.
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TrustError(f"--upstream-ca {path}: cannot read it: {e}") from e
    return certificates_pem(data, f"--upstream-ca {path}")


def public_roots_pem() -> bytes:
    """certifi's public root certificates (Mozilla's CA list), PEM."""
    return certifi.contents().encode("ascii")


def _bundle(*parts: tuple[str, bytes]) -> bytes:
    # A comment line before each part: text outside BEGIN/END lines is ignored by every
    # PEM reader (OpenSSL, Go, Python), and it tells a human what is inside.
    return b"".join(f"\n# {title}\n".encode() + pem for title, pem in parts if pem)


def upstream_trust_pem(extra_ca_pem: bytes | None) -> bytes:
    """What the sidecar verifies origins with: the public roots and the `--upstream-ca` PEM.

    Raises TrustError when `extra_ca_pem` holds no certificates.
    """
    extra = certificates_pem(extra_ca_pem, "--upstream-ca") if extra_ca_pem is not None else b""
    return public_roots_pem() + _bundle(("--upstream-ca", extra))


def trust_store(bundle_pem: bytes) -> bytes:
    """The certificates of a PEM bundle as a password-less PKCS12 trust store.

    What the JVM reads with `-Djavax.net.ssl.trustStore=... -Djavax.net.ssl.trustStoreType=
    PKCS12` and no password: each certificate is a trusted entry (Java's own attribute,
    which `serialize_java_truststore` writes), named by its place in the bundle.
    """
    with warnings.catch_warnings():
        # certifi's roots include one with serial number 0, which cryptography still
        # parses (with a deprecation warning) and which the JVM's own cacerts trust too.
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        certs = x509.load_pem_x509_certificates(bundle_pem)
    entries = [
        pkcs12.PKCS12Certificate(cert, f"burstbuffer-{number}".encode())
        for number, cert in enumerate(certs, 1)
    ]
    return pkcs12.serialize_java_truststore(entries, serialization.NoEncryption())


def write_private(path: Path, data: bytes) -> None:
    """Write a sidecar-private file (mode 0600) atomically, replacing any older one."""
    write_atomically(path, data, 0o600)


def _certificate_in(path: Path) -> x509.Certificate | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TrustError(f"cannot read {path}: {e}") from e
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as e:
        raise TrustError(f"{path} holds no readable certificate ({e})") from e


def write_trust_files(trust_dir: Path, ca_cert_pem: bytes, extra_ca_pem: bytes | None) -> None:
    """Write the trust files into `trust_dir`, once (see the module docstring).

    Raises TrustError when the directory holds another CA's certificate, when a file
    cannot be read or written, or when `extra_ca_pem` holds no certificates.
    """
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    extra = certificates_pem(extra_ca_pem, "--upstream-ca") if extra_ca_pem is not None else b""
    ca_file, bundle_file = trust_dir / CA_CERT_FILE, trust_dir / BUNDLE_FILE
    store_file = trust_dir / TRUST_STORE_FILE
    present = _certificate_in(ca_file)
    if present is not None and present != ca_cert:
        raise TrustError(
            f"{ca_file} holds another CA ({present.subject.rfc4514_string()}, sha256 "
            f"{present.fingerprint(hashes.SHA256()).hex()}) than this sidecar's "
            f"({ca_cert.subject.rfc4514_string()}): the CA directory was lost while the "
            "trust directory survived. The app containers trust the old CA, whose key is "
            "gone, and replacing the file would not reach them: delete the pod."
        )
    if present is not None and bundle_file.exists() and store_file.exists():
        logger.info("trust files in %s: present for this CA, left untouched", trust_dir)
        return
    try:
        if present is not None and bundle_file.exists():
            write_atomically(store_file, trust_store(bundle_file.read_bytes()), 0o644)
            logger.info("trust files in %s: %s added", trust_dir, store_file.name)
            return
        bundle = public_roots_pem() + _bundle(
            (f"burstbuffer pod CA: {ca_cert.subject.rfc4514_string()}", ca_pem),
            ("--upstream-ca", extra),
        )
        trust_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(bundle_file, bundle, 0o644)
        write_atomically(store_file, trust_store(bundle), 0o644)
        if present is None:
            write_atomically(ca_file, ca_pem, 0o644)
    except OSError as e:
        raise TrustError(f"cannot write the trust files into {trust_dir}: {e}") from e
    except ValueError as e:  # a bundle left by an earlier sidecar that is not PEM
        raise TrustError(f"{bundle_file} holds no readable certificates ({e})") from e
    logger.info("trust files in %s: written for %s", trust_dir, ca_cert.subject.rfc4514_string())
