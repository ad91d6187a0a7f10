"""The subject common names of a certificate read by ``strict.x509_names`` are exactly those
cryptography reads, on real certificates of every shape the reader must walk: several CNs,
none, multi-valued RDNs, each string type X.520 allows, long subjects (long-form lengths),
version 1 certificates (no version field), a key after the certificate. Then damaged input:
truncated at every byte, bytes flipped, junk PEM: a tuple of text or ``MalformedInput``,
nothing else (the fuzz harness in tests/fuzz/test_node_identity.py goes further)."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.strict import MalformedInput
from nodeagent.strict.x509_names import (
    first_certificate_der,
    pem_subject_common_names,
    subject_common_names,
)

KEY = ec.generate_private_key(ec.SECP256R1())
NOW = datetime.datetime(2026, 11, 28, tzinfo=datetime.UTC)


def certificate(subject: x509.Name, *, version_1: bool = False) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer CA")]))
        .public_key(KEY.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW)
        .not_valid_after(NOW + datetime.timedelta(days=1))
    )
    cert = builder.sign(KEY, hashes.SHA256())
    if version_1:  # the builder writes v3; a v1 body has no [0] version field
        der = cert.public_bytes(serialization.Encoding.DER)
        assert b"\xa0\x03\x02\x01\x02" in der
    return cert


def cn(value: str, kind: _ASN1Type = _ASN1Type.UTF8String) -> x509.NameAttribute[str]:
    return x509.NameAttribute(NameOID.COMMON_NAME, value, _type=kind)


def org(value: str) -> x509.NameAttribute[str]:
    return x509.NameAttribute(NameOID.ORGANIZATION_NAME, value)


SUBJECTS = {
    "kubelet": x509.Name([org("system:nodes"), cn("system:node:worker-0.example.com")]),
    "none": x509.Name([org("no common name")]),
    "two": x509.Name([cn("first"), org("o"), cn("second")]),
    "multi-valued": x509.Name([x509.RelativeDistinguishedName([org("o"), cn("in a set")])]),
    "printable": x509.Name([cn("system:node:a", _ASN1Type.PrintableString)]),
    "ia5": x509.Name([cn("node@example", _ASN1Type.IA5String)]),
    "bmp": x509.Name([cn("nœud-Ω", _ASN1Type.BMPString)]),
    "universal": x509.Name([cn("узел-😀", _ASN1Type.UniversalString)]),
    "utf8": x509.Name([cn("noeud-é-節點")]),
    "long": x509.Name([cn("system:node:" + "a" * 50), *[org("o" * 60) for _ in range(6)]]),
}


@pytest.mark.parametrize("name", sorted(SUBJECTS))
def test_the_names_are_cryptographys(name: str) -> None:
    cert = certificate(SUBJECTS[name])
    expected = tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME))
    der = cert.public_bytes(serialization.Encoding.DER)
    assert subject_common_names(der) == expected
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key = KEY.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    assert pem_subject_common_names(pem + key) == expected  # the kubelet's combined file
    assert pem_subject_common_names(b"junk before\n" + pem) == expected


def tlv(tag: int, content: bytes) -> bytes:
    size = len(content)
    if size < 0x80:
        return bytes([tag, size]) + content
    raw = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(raw)]) + raw + content


def test_a_version_1_certificate_has_no_version_field_and_is_read() -> None:
    tbs = certificate(SUBJECTS["kubelet"]).tbs_certificate_bytes
    start = 2 if tbs[1] < 0x80 else 2 + (tbs[1] & 0x7F)
    assert tbs[start : start + 5] == b"\xa0\x03\x02\x01\x02"  # [0] version v3
    v1 = tlv(0x30, tlv(0x30, tbs[start + 5 :]))
    assert subject_common_names(v1) == ("system:node:worker-0.example.com",)


def test_every_truncation_is_malformed_never_an_index_error() -> None:
    der = certificate(SUBJECTS["two"]).public_bytes(serialization.Encoding.DER)
    for cut in range(len(der)):  # the outer length no longer fits: refused at the first step
        with pytest.raises(MalformedInput):
            subject_common_names(der[:cut])


@pytest.mark.parametrize(
    "pem",
    [
        b"",
        b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nMIIB\n",
        b"-----BEGIN CERTIFICATE-----\n\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nMIQAAAAA\n-----END CERTIFICATE-----\n",
    ],
)
def test_junk_pem_is_malformed(pem: bytes) -> None:
    with pytest.raises(MalformedInput):
        pem_subject_common_names(pem)


DER = certificate(SUBJECTS["two"]).public_bytes(serialization.Encoding.DER)


@given(st.lists(st.tuples(st.integers(0, len(DER) - 1), st.integers(0, 255)), max_size=8))
def test_flipped_bytes_give_text_or_malformed(edits: list[tuple[int, int]]) -> None:
    data = bytearray(DER)
    for where, value in edits:
        data[where] = value
    try:
        names = subject_common_names(bytes(data))
    except MalformedInput:
        return
    assert all(isinstance(n, str) for n in names)


def test_the_first_block_is_taken_and_a_huge_one_refused() -> None:
    pem = certificate(SUBJECTS["kubelet"]).public_bytes(serialization.Encoding.PEM)
    assert first_certificate_der(pem + pem) == first_certificate_der(pem)
    big = b"-----BEGIN CERTIFICATE-----\n" + b"QUFB" * 30000 + b"\n-----END CERTIFICATE-----\n"
    with pytest.raises(MalformedInput, match="over"):
        first_certificate_der(big)
