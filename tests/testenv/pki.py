"""A throwaway PKI for the peer tests: a CA, node certificates signed by it, and files.

``Authority`` makes a self-signed CA (ECDSA P-256) and issues leaf certificates: a
serving certificate with an IP SAN (127.0.0.1) and a DNS SAN, and client certificates
(``system:node:<name>``, as the kubelet's). ``write_pair`` writes a certificate and its key
as PEM files; ``cert_dir`` lays out what skopeo's ``--src-cert-dir`` reads (``ca.crt``,
``client.cert``, ``client.key``).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Issued:
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write_pair(self, cert_file: Path, key_file: Path) -> None:
        """PEM files; the same path for both gives one file holding both (the kubelet's)."""
        if cert_file == key_file:
            cert_file.write_bytes(self.cert_pem + self.key_pem)
            return
        cert_file.write_bytes(self.cert_pem)
        key_file.write_bytes(self.key_pem)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


class Authority:
    """A CA that issues leaf certificates."""

    def __init__(self, common_name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def _issue(
        self, subject: x509.Name, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return Issued(builder.sign(self.key, hashes.SHA256()), key)

    def serving(self, node: str, ip: str = "127.0.0.1") -> Issued:
        """A kubelet-like serving certificate: ``system:node:<node>``, IP and DNS SANs."""
        sans: list[x509.GeneralName] = [
            x509.IPAddress(ipaddress.ip_address(ip)),
            x509.DNSName(node),
        ]
        return self._issue(
            _name(f"system:node:{node}", "system:nodes"), ExtendedKeyUsageOID.SERVER_AUTH, sans
        )

    def client(self, node: str) -> Issued:
        """A kubelet-like client certificate: ``system:node:<node>`` in ``system:nodes``."""
        return self._issue(
            _name(f"system:node:{node}", "system:nodes"), ExtendedKeyUsageOID.CLIENT_AUTH, []
        )


def cert_dir(directory: Path, ca: Authority, client: Issued | None) -> Path:
    """What ``skopeo --src-cert-dir`` reads: ``ca.crt``, and ``client.cert``/``client.key``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    if client is not None:
        client.write_pair(directory / "client.cert", directory / "client.key")
    return directory
