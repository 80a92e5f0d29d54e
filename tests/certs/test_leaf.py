"""A host's leaf as the lean front end serves it (`certs.leaf`): the leaf alone, which a
strict client trusting the pod's bundle verifies without being sent the CA."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509

from certs.bundle import BUNDLE_FILE, write_trust_files
from certs.ca import load_or_create_ca
from certs.leaf import leaf_pem

HOST = "data.example.org"


def test_the_chain_is_the_leaf_alone_and_verifies_against_the_bundle(
    tmp_path: Path, client_context, handshake
) -> None:
    ca = load_or_create_ca(tmp_path / "ca")
    chain_pem, key_pem = leaf_pem(ca, HOST)
    chain = x509.load_pem_x509_certificates(chain_pem)
    assert len(chain) == 1
    chain[0].verify_directly_issued_by(ca.cert)
    names = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [HOST]

    (tmp_path / "leaf.crt").write_bytes(chain_pem)
    (tmp_path / "leaf.key").write_bytes(key_pem)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "leaf.crt", tmp_path / "leaf.key")
    write_trust_files(tmp_path / "trust", ca.cert_pem, None)
    client = client_context(cafile=tmp_path / "trust" / BUNDLE_FILE)
    assert handshake(server, client, HOST) == b"hello from the server"
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(server, client_context(), HOST)  # the public roots alone
