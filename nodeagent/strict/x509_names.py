"""The subject common names of a PEM certificate, read without loading cryptography (pure).

The daemon reads one field of one local file at start in cluster mode: the kubelet's client
certificate's subject CN (``system:node:<name>``, ``adapters.kubelet_identity``). Loading
``cryptography.x509`` for it kept 10.5 MiB resident for the daemon's whole life
(``bench/import_cost.py``, decision 0069). This reads the same field with the standard
library: the first ``CERTIFICATE`` block of the PEM text, strict base64 (``binascii``), then
a DER walk of exactly the path RFC 5280 section 4.1 fixes::

    Certificate  ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL,
        serialNumber INTEGER, signature SEQUENCE, issuer Name, validity SEQUENCE,
        subject Name, ... }, ... }
    Name ::= SEQUENCE OF SET OF SEQUENCE { type OBJECT IDENTIFIER, value ANY }

Every length is checked against its enclosing value (definite lengths only, at most 4 length
bytes, as DER requires); the walk visits each byte at most once and never recurses beyond
the fixed depth above, so a hostile file costs linear time. A common name is the value of an
attribute of type 2.5.4.3 in one of the string types X.520 allows (UTF8String,
PrintableString, IA5String, TeletexString read as Latin-1, BMPString, UniversalString).
tests/unit/strict/test_x509_names.py checks the answers against cryptography's on the same
certificates; tests/fuzz/test_node_identity.py feeds it junk.
"""

from __future__ import annotations

import binascii
from typing import Final

from nodeagent.strict import MalformedInput

BEGIN: Final = b"-----BEGIN CERTIFICATE-----"
END: Final = b"-----END CERTIFICATE-----"
MAX_DER_BYTES: Final = 64 * 1024
"""A certificate's DER is a few KiB; a larger one is refused."""

_SEQUENCE, _SET, _OID, _INTEGER, _CONTEXT_0 = 0x30, 0x31, 0x06, 0x02, 0xA0
_COMMON_NAME_OID: Final = bytes([0x55, 0x04, 0x03])  # 2.5.4.3
_STRINGS: Final = {
    0x0C: "utf-8",  # UTF8String
    0x13: "ascii",  # PrintableString
    0x16: "ascii",  # IA5String
    0x14: "latin-1",  # TeletexString (T.61), as OpenSSL and cryptography read it
    0x1E: "utf-16-be",  # BMPString
    0x1C: "utf-32-be",  # UniversalString
}


def first_certificate_der(pem: bytes) -> bytes:
    """The DER bytes of the first ``CERTIFICATE`` block of ``pem`` (a key may follow)."""
    start = pem.find(BEGIN)
    if start < 0:
        raise MalformedInput("no PEM certificate block")
    end = pem.find(END, start)
    if end < 0:
        raise MalformedInput("the PEM certificate block has no end line")
    body = b"".join(pem[start + len(BEGIN) : end].split())
    try:
        der = binascii.a2b_base64(body, strict_mode=True)
    except binascii.Error as err:
        raise MalformedInput("the PEM certificate block is not base64") from err
    if len(der) > MAX_DER_BYTES:
        raise MalformedInput(f"the certificate is over {MAX_DER_BYTES} bytes")
    return der


def _value(der: bytes, pos: int, end: int, tag: int) -> tuple[int, int]:
    """The (start, stop) of the value of the element at ``pos`` with ``tag``."""
    if pos + 2 > end:
        raise MalformedInput("the certificate ends inside an element")
    if der[pos] != tag:
        raise MalformedInput(f"expected DER tag {tag:#04x}, found {der[pos]:#04x}")
    length, pos = der[pos + 1], pos + 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or pos + count > end:
            raise MalformedInput("a DER length is indefinite or too long")
        length, pos = int.from_bytes(der[pos : pos + count], "big"), pos + count
    if pos + length > end:
        raise MalformedInput("a DER element runs past its enclosing one")
    return pos, pos + length


def _skip(der: bytes, pos: int, end: int) -> int:
    """Past the element at ``pos``, whatever its tag."""
    if pos >= end:
        raise MalformedInput("the certificate ends inside an element")
    _, stop = _value(der, pos, end, der[pos])
    return stop


def _subject_span(der: bytes) -> tuple[int, int]:
    cert_start, cert_end = _value(der, 0, len(der), _SEQUENCE)
    pos, tbs_end = _value(der, cert_start, cert_end, _SEQUENCE)
    if pos < tbs_end and der[pos] == _CONTEXT_0:
        pos = _skip(der, pos, tbs_end)  # version
    _, pos = _value(der, pos, tbs_end, _INTEGER)  # serialNumber
    for _field in ("signature", "issuer", "validity"):
        _, pos = _value(der, pos, tbs_end, _SEQUENCE)
    return _value(der, pos, tbs_end, _SEQUENCE)


def subject_common_names(der: bytes) -> tuple[str, ...]:
    """Every common name in the subject of the DER certificate ``der``, in order."""
    pos, end = _subject_span(der)
    names = []
    while pos < end:
        rdn, pos = _value(der, pos, end, _SET)
        while rdn < pos:
            attribute, rdn = _value(der, rdn, pos, _SEQUENCE)
            oid_start, oid_end = _value(der, attribute, rdn, _OID)
            if der[oid_start:oid_end] != _COMMON_NAME_OID:
                continue
            if oid_end >= rdn or der[oid_end] not in _STRINGS:
                raise MalformedInput("the common name is not a string")
            codec = _STRINGS[der[oid_end]]
            start, stop = _value(der, oid_end, rdn, der[oid_end])
            try:
                names.append(der[start:stop].decode(codec))
            except UnicodeDecodeError as err:
                raise MalformedInput("the common name is not valid text") from err
    return tuple(names)


def pem_subject_common_names(pem: bytes) -> tuple[str, ...]:
    """``subject_common_names`` of the first certificate in ``pem``; ``MalformedInput``."""
    return subject_common_names(first_certificate_der(pem))
