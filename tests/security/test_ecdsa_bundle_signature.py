"""Attacks on the ECDSA manifest signature (decision 0075) and the rule that combines it
with minisign: a changed manifest or comment, an unknown key, another curve, a key that is
not ECDSA, an oversized or malformed file, a half-valid pair, and a FIPS host given a
minisign-only bundle. Real ``cryptography`` keys."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from nodeagent.bundles import ecdsa_signature as ecdsa
from nodeagent.bundles import minisign
from nodeagent.errors import (
    Ed25519Refused,
    KeyMalformed,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    UnknownSigningKey,
)

MANIFEST = b'{"bundle": "factory-7"}'
HEAD = "untrusted comment: a\necdsa-p256-sha256:0011223344556677:"
TAIL = "\ntrusted comment: c\nAAAAAAAA\n"
COMMENT = "bundle factory-7 created 2026-11-28"


def private_pem(curve: ec.EllipticCurve) -> bytes:
    key = ec.generate_private_key(curve)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_of(pem: bytes) -> ecdsa.EcdsaKey:
    key = serialization.load_pem_private_key(pem, password=None)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return ecdsa.load_public_key(public.decode(), name="factory.pem")


@pytest.fixture(scope="module")
def p256() -> bytes:
    return private_pem(ec.SECP256R1())


@pytest.fixture(scope="module")
def trusted(p256: bytes) -> dict[bytes, ecdsa.EcdsaKey]:
    key = public_of(p256)
    return {key.key_id: key}


@pytest.mark.parametrize("curve", [ec.SECP256R1(), ec.SECP384R1()], ids=["p256", "p384"])
def test_a_signature_by_a_trusted_key_verifies(curve: ec.EllipticCurve) -> None:
    pem = private_pem(curve)
    key = public_of(pem)
    verified = ecdsa.verify(
        MANIFEST, ecdsa.sign(MANIFEST, pem, trusted_comment=COMMENT), {key.key_id: key}
    )
    assert (verified.trusted_comment, verified.key) == (COMMENT, key)


def test_a_changed_manifest_or_comment_is_refused(
    p256: bytes, trusted: dict[bytes, ecdsa.EcdsaKey]
) -> None:
    text = ecdsa.sign(MANIFEST, p256, trusted_comment=COMMENT)
    with pytest.raises(SignatureInvalid, match="does not match the manifest"):
        ecdsa.verify(MANIFEST + b" ", text, trusted)
    forged = text.replace(COMMENT, "bundle factory-8 created 2026-11-28")
    with pytest.raises(SignatureInvalid, match="trusted comment was changed"):
        ecdsa.verify(MANIFEST, forged, trusted)


def test_an_unknown_key_is_named_and_refused(trusted: dict[bytes, ecdsa.EcdsaKey]) -> None:
    other = private_pem(ec.SECP256R1())
    with pytest.raises(UnknownSigningKey) as raised:
        ecdsa.verify(MANIFEST, ecdsa.sign(MANIFEST, other, trusted_comment=COMMENT), trusted)
    assert raised.value.key_id == public_of(other).key_id


def test_the_algorithm_must_be_the_keys_curve(
    p256: bytes, trusted: dict[bytes, ecdsa.EcdsaKey]
) -> None:
    text = ecdsa.sign(MANIFEST, p256, trusted_comment=COMMENT).replace(
        "ecdsa-p256-sha256", "ecdsa-p384-sha384"
    )
    with pytest.raises(SignatureInvalid, match="the key is secp256r1"):
        ecdsa.verify(MANIFEST, text, trusted)


@pytest.mark.parametrize(
    "make",
    [
        lambda: private_pem(ec.SECP521R1()),
        lambda: ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    ],
    ids=["p521", "ed25519"],
)
def test_a_key_of_another_curve_or_kind_is_malformed(make: object) -> None:
    pem = make()  # type: ignore[operator]
    public = (
        serialization.load_pem_private_key(pem, password=None)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(KeyMalformed):
        ecdsa.load_public_key(public.decode(), name="x.pem")
    with pytest.raises(KeyMalformed):
        ecdsa.load_public_key("-----BEGIN PUBLIC KEY-----\n" + "A" * 5000, name="big.pem")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (None, SignatureMissing),
        ("", SignatureMissing),
        ("x" * 1025, SignatureMalformed),
        ("untrusted comment: a\nb\ntrusted comment: c\n", SignatureMalformed),
        (
            "untrusted comment: a\necdsa-p256-sha256:00:AAAAAAAA\ntrusted comment: c\nAAAAAAAA\n",
            SignatureMalformed,
        ),
        (
            f"{HEAD}AAAAAAA*{TAIL}",
            SignatureMalformed,
        ),
        (
            f"{HEAD}AAAAAAA{TAIL}",
            SignatureMalformed,
        ),
        (b"\xff" * 20, SignatureMalformed),
    ],
)
def test_a_malformed_file_is_refused_before_any_crypto(
    text: str | bytes | None, error: type[Exception]
) -> None:
    with pytest.raises(error):
        ecdsa.parse_signature(text)


def minisign_pair() -> tuple[str, dict[bytes, minisign.PublicKey]]:
    public_text, secret_text = minisign.generate_keypair()
    public = minisign.parse_public_key(public_text)
    signature = minisign.sign(
        MANIFEST, minisign.parse_secret_key(secret_text), trusted_comment=COMMENT
    )
    return signature, {public.key_id: public}


def test_the_combined_rule(p256: bytes, trusted: dict[bytes, ecdsa.EcdsaKey]) -> None:
    minisig, minisign_keys = minisign_pair()
    signed = ecdsa.sign(MANIFEST, p256, trusted_comment=COMMENT)

    def check(minisig: str | None, signature: str | None, host_fips: bool | None) -> str:
        return ecdsa.verify_manifest(
            MANIFEST,
            minisig=minisig,
            ecdsa=signature,
            minisign_keys=minisign_keys,
            ecdsa_keys=trusted,
            host_fips=host_fips,
        )

    # a host not in FIPS mode: either one is enough
    assert check(minisig, None, False) == COMMENT
    assert check(None, signed, None) == COMMENT
    assert check(minisig, signed, False) == COMMENT
    # both there: both must verify (never half-trusted)
    broken = minisig.replace(minisig.splitlines()[1], minisig.splitlines()[1][:-4] + "AAA=")
    with pytest.raises((SignatureInvalid, SignatureMalformed)):
        check(broken, signed, False)
    # a FIPS host: the ECDSA signature is required, minisign's is not looked at
    with pytest.raises(Ed25519Refused, match="no ECDSA signature"):
        check(minisig, None, True)
    assert check("garbage", signed, True) == COMMENT
