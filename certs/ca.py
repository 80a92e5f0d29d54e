"""The pod CA: created once in the sidecar's private directory, in mitmproxy's file format.

The sidecar gives mitmproxy the CA directory as its `confdir`; mitmproxy then loads it
with `CertStore.from_store(ca_dir, "mitmproxy", ...)`, which creates a CA of its own only
when `mitmproxy-ca.pem` is missing, and a DH parameter file only when that is missing.
`load_or_create_ca()` writes all of them first, so mitmproxy only ever reads:

| file | mode | content |
| --- | --- | --- |
| `mitmproxy-ca.pem` | 0600 | the CA key (PKCS #8) followed by the CA certificate |
| `mitmproxy-ca-cert.pem` | 0644 | the CA certificate alone (mitmproxy's name for it) |
| `mitmproxy-dhparam.pem` | 0644 | DH parameters: RFC 7919's ffdhe2048 group |

The directory itself is 0700. Each file is written to a temporary name and renamed into
place, the key file last: a sidecar killed half-way leaves either no `mitmproxy-ca.pem`
(the next start creates the CA afresh) or a complete CA. A directory that holds a
`mitmproxy-ca.pem` is never rewritten: the pod's trust files pin its certificate. If it
is damaged, `CAError` says so rather than replacing it.

The key is EC P-256. mitmproxy signs every leaf certificate with the CA key *and* gives
the leaf the CA's public key, so the CA key type is also the type of every TLS server key
the clients see: a P-256 signature, one per handshake, costs several times less CPU than an
RSA-2048 one, and every TLS client of the last decade accepts it.
Directories made by mitmproxy itself (RSA keys) load as well.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

logger = logging.getLogger(__name__)

# The file names mitmproxy derives from its `CONF_BASENAME` ("mitmproxy").
CA_FILE = "mitmproxy-ca.pem"
CA_CERT_FILE = "mitmproxy-ca-cert.pem"
DHPARAM_FILE = "mitmproxy-dhparam.pem"

# CA validity: backdated a day for clients with a slow clock; ten years ahead, because a
# pod's CA must outlive the pod and nothing ever renews it.
VALIDITY_BACKDATE = datetime.timedelta(days=1)
VALIDITY = datetime.timedelta(days=10 * 365)

# RFC 7919 Appendix A.1, ffdhe2048, as PKCS #3 PEM. mitmproxy hands a DH group to OpenSSL
# for DHE cipher suites. A fixed, published group: generating one takes minutes, and a
# named group is the reviewed choice.
FFDHE2048_PEM = b"""-----BEGIN DH PARAMETERS-----
MIIBCAKCAQEA//////////+t+FRYortKmq/cViAnPTzx2LnFg84tNpWp4TZBFGQz
+8yTnc4kmz75fS/jY2MMddj2gbICrsRhetPfHtXV/WVhJDP1H18GbtCFY2VVPe0a
87VXE15/V8k1mE8McODmi3fipona8+/och3xWKE2rec1MKzKT0g6eXq8CrGCsyT7
YdEIqUuyyOP7uWrat2DX9GgdT0Kj3jlN9K5W7edjcrsZCwenyO4KbXCeAvzhzffi
7MA0BM0oNC9hkXL+nOmFg/+OTxIy7vKBg8P+OxtMb61zO7X8vC7CIAXFjvGDfRaD
ssbzSibBsu/6iGtCOGEoXJf//////////wIBAg==
-----END DH PARAMETERS-----
"""

CAKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class CAError(Exception):
    """The CA directory cannot be created, or holds a CA that cannot be used."""


@dataclass(frozen=True)
class PodCA:
    """The pod CA: its certificate and its private key (which is never printed)."""

    cert: x509.Certificate
    key: CAKey = field(repr=False)

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, PEM: what the pod's trust files hold."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def fingerprint(self) -> str:
        """The certificate's SHA-256 fingerprint in hex, to name the CA in logs."""
        return self.cert.fingerprint(hashes.SHA256()).hex()

    @property
    def name(self) -> str:
        """The certificate's common name, e.g. `burstbuffer pod CA 3f9a0c1e`."""
        names = self.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(names[0].value) if names else self.cert.subject.rfc4514_string()


def write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to `path` with `mode`: readers see the old file or the new one, never a part.

    The temporary file is created 0600 (so a key is never readable by others, whatever
    the umask), filled, synced, given `mode`, and renamed over `path`.
    """
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)  # makes the rename itself durable
    finally:
        os.close(directory)


def load_or_create_ca(ca_dir: Path) -> PodCA:
    """The pod CA in `ca_dir`: created there on first start, reused untouched afterwards.

    Raises CAError when the directory cannot be made or holds a damaged CA; the message
    names the file and what is wrong with it.
    """
    _make_private_dir(ca_dir)
    if (ca_dir / CA_FILE).exists():
        ca = _load(ca_dir)
        logger.info("pod CA %s (sha256 %s): reused from %s", ca.name, ca.fingerprint, ca_dir)
    else:
        ca = _create(ca_dir)
        logger.info("pod CA %s (sha256 %s): created in %s", ca.name, ca.fingerprint, ca_dir)
    return ca


def _make_private_dir(ca_dir: Path) -> None:
    try:
        ca_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = ca_dir.stat().st_mode & 0o777
    except OSError as e:
        raise CAError(f"cannot create the CA directory {ca_dir}: {e}") from e
    if mode & 0o077:
        try:
            ca_dir.chmod(0o700)
        except PermissionError:
            # A directory made by someone else (e.g. a volume's root): the key file's own
            # 0600 still protects the key. Refusing would leave the pod without a proxy.
            logger.warning(
                "CA directory %s is mode %o and not ours to change; the key file stays 0600. "
                "Give --ca-dir a subdirectory the sidecar can create.",
                ca_dir,
                mode,
            )


def _new_certificate(key: CAKey) -> x509.Certificate:
    # A random name per CA, so that two pods' CAs can never be mistaken for each other.
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, f"burstbuffer pod CA {secrets.token_hex(4)}"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "burstbuffer"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - VALIDITY_BACKDATE)
        .not_valid_after(now + VALIDITY)
        # Path length 0: the CA signs leaves only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        # mitmproxy copies this into each leaf's authority key identifier.
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _create(ca_dir: Path) -> PodCA:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _new_certificate(key)
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        # Leftovers of a creation that was killed half-way.
        for leftover in ca_dir.glob(".mitmproxy-*.tmp"):
            leftover.unlink()
        write_atomically(ca_dir / DHPARAM_FILE, FFDHE2048_PEM, 0o644)
        write_atomically(ca_dir / CA_CERT_FILE, cert_pem, 0o644)
        # Last: its presence is what says "a complete CA lives here".
        write_atomically(ca_dir / CA_FILE, key_pem + cert_pem, 0o600)
    except OSError as e:
        raise CAError(f"cannot write the pod CA into {ca_dir}: {e}") from e
    return PodCA(cert, key)


def _read(path: Path, advice: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CAError(f"{path} is missing beside {path.parent / CA_FILE}{advice}") from None
    except OSError as e:
        raise CAError(f"cannot read {path}: {e}") from e


def _load(ca_dir: Path) -> PodCA:
    ca_file = ca_dir / CA_FILE
    advice = f"; the pod CA in {ca_dir} is damaged: delete the pod, its replacement gets a new one"
    raw = _read(ca_file, advice)
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise CAError(f"{ca_file} holds no readable unencrypted private key ({e}){advice}") from e
    if not isinstance(key, CAKey):
        raise CAError(f"{ca_file} holds a {type(key).__name__}, not an EC or RSA key{advice}")
    try:
        certs = x509.load_pem_x509_certificates(raw)
    except ValueError as e:
        raise CAError(f"{ca_file} holds no readable certificate ({e}){advice}") from e
    if len(certs) != 1:
        raise CAError(f"{ca_file} holds {len(certs)} certificates, expected one{advice}")
    cert = certs[0]
    if cert.public_key() != key.public_key():
        raise CAError(f"{ca_file}: the key and the certificate do not belong together{advice}")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise CAError(f"{ca_file}: the certificate is not a CA certificate{advice}")
    if cert.not_valid_after_utc <= datetime.datetime.now(datetime.UTC):
        raise CAError(f"{ca_file}: the CA expired on {cert.not_valid_after_utc:%Y-%m-%d}{advice}")
    cert_file = ca_dir / CA_CERT_FILE
    try:
        same = x509.load_pem_x509_certificate(_read(cert_file, advice)) == cert
    except ValueError:
        same = False
    if not same:
        raise CAError(f"{cert_file} does not hold the certificate of {ca_file}{advice}")
    dhparam_file = ca_dir / DHPARAM_FILE
    try:
        serialization.load_pem_parameters(_read(dhparam_file, advice))
    except (ValueError, UnsupportedAlgorithm) as e:
        raise CAError(f"{dhparam_file} holds no readable DH parameters ({e}){advice}") from e
    return PodCA(cert, key)
