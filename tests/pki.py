"""A throwaway certificate authority for tests that serve or speak TLS: the server's
own (tests/security/test_tls.py), etcd's client certificates and the nodes' TLS
(tests/cluster/test_etcd_closed.py, test_cluster_trust.py). Certificates for
127.0.0.1 and localhost, valid for a day."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER = (ExtendedKeyUsageOID.SERVER_AUTH,)
SERVER_AND_CLIENT = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)


def common_name(name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])


class TestCA:
    __test__ = False  # not a test class for pytest

    def __init__(self, path: Path, name: str = "Herald test CA") -> None:
        self.path = path  # the CA certificate, PEM
        self._now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = common_name(name)
        cert = (
            self._builder(self._name, self._key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
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
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def _builder(
        self, subject: x509.Name, key: ec.EllipticCurvePrivateKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._now - datetime.timedelta(minutes=5))
            .not_valid_after(self._now + datetime.timedelta(days=1))
        )

    def issue(
        self,
        cert_path: Path,
        key_path: Path,
        subject: x509.Name,
        usages: Sequence[x509.ObjectIdentifier] = SERVER,
    ) -> None:
        """A certificate for 127.0.0.1 and localhost, and its key, both PEM."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            self._builder(subject, key)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
