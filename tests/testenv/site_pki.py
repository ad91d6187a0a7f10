"""Certificates for the site's nodes, shaped like a kubelet's: one CA, one certificate a node.

``make_ca("site CA")`` makes a self-signed CA (ECDSA P-256, as the kubelet's keys are);
``issue_node_cert(ca, "node-1", ["198.19.4.11"])`` a node certificate with the node's name
as DNS SAN and its addresses as IP SANs, the extended key usages serverAuth and clientAuth
(one certificate a node serves with and fetches with; a kubelet has one of each, the same
shape), signed by the CA; ``write_pem_bundle(path, cert)`` writes it the way the kubelet
writes ``kubelet-server-current.pem``: the certificate then its private key, in one PEM file
(mode 0600). ``write_ca(path, ca)`` writes the CA's certificate alone, the trust bundle.

A second ``make_ca`` gives an unrelated CA for the negative tests: its certificates must
fail the handshake against nodes trusting the first.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)
BACKDATE = datetime.timedelta(minutes=5)
"""Not-before a little in the past: a clock a few seconds behind still accepts it."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key (a CA's or a node's)."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization is not None:
        parts.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def make_ca(common_name: str) -> Issued:
    """A self-signed CA that may sign node certificates (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def issue_node_cert(ca: Issued, name: str, ips: Sequence[str]) -> Issued:
    """A node's certificate: CN ``system:node:<name>`` (group ``system:nodes``), DNS SAN
    ``name``, IP SANs ``ips``, usable as TLS server and client."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(name)]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    eku = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    cert = (
        _builder(_name(f"system:node:{name}", "system:nodes"), ca.cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(eku, critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(cert, key)


def write_pem_bundle(path: Path, issued: Issued) -> Path:
    """The certificate then its key in one PEM file (the kubelet's ``*-current.pem``), 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.touch(mode=0o600)
    partial.write_bytes(issued.cert_pem() + issued.key_pem())
    partial.rename(path)
    return path


def write_ca(path: Path, *cas: Issued) -> Path:
    """The CA certificates, concatenated: the trust bundle a node checks its peers against."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(ca.cert_pem() for ca in cas))
    return path
