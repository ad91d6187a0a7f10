"""ECDSA signatures of a bundle's manifest: the FIPS-approved alternative to minisign's
Ed25519 (docs/decisions/0075-fips-and-bundle-signatures.md, "The FIPS-approved bundle
signature"). Verification and the rule that combines it with minisign
(``verify_signatures``) are here; every reader of a bundle's manifest (a medium, the store,
a peer) goes through ``adapters.bundles.tree.verify_signed``, which calls it.

The signature file, UTF-8, at most ``MAX_SIGNATURE_BYTES``, four lines as minisign's::

    untrusted comment: <anything, not signed>
    ecdsa-p256-sha256:<key id, 16 hex>:<base64 DER signature of the manifest's bytes>
    trusted comment: <text, signed below>
    <base64 DER signature of (the first signature's DER bytes + the trusted comment)>

``ecdsa-p384-sha384`` likewise. A trusted key is a PEM SubjectPublicKeyInfo of a named
curve, P-256 or P-384 only; its id is the first 8 bytes of SHA-256 of that DER encoding.

Host interfaces: none (``cryptography`` is loaded on first use, as minisign's).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.bundles import minisign
from nodeagent.errors import (
    Ed25519Refused,
    KeyMalformed,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    UnknownSigningKey,
)
from nodeagent.strict import clip

MAX_SIGNATURE_BYTES: Final = 1024
MAX_KEY_BYTES: Final = 4096
MAX_COMMENT_BYTES: Final = 512
ALGORITHMS: Final = {
    "ecdsa-p256-sha256": ("secp256r1", "sha256"),
    "ecdsa-p384-sha384": ("secp384r1", "sha384"),
}
"""Algorithm name in the signature -> (curve name, hash name)."""
SIGNATURE_LINE: Final = re.compile(
    r"(ecdsa-p256-sha256|ecdsa-p384-sha384):([0-9a-f]{16}):([A-Za-z0-9+/=]{8,200})"
)
BASE64_LINE: Final = re.compile(r"[A-Za-z0-9+/=]{8,200}")


@dataclass(frozen=True, slots=True)
class EcdsaKey:
    """A trusted ECDSA public key."""

    key_id: bytes
    curve: str
    der: bytes
    name: str

    @property
    def key_id_hex(self) -> str:
        return self.key_id.hex()


@dataclass(frozen=True, slots=True)
class EcdsaSignature:
    algorithm: str
    key_id: bytes
    signature: bytes
    trusted_comment: str
    global_signature: bytes


@dataclass(frozen=True, slots=True)
class EcdsaVerified:
    key: EcdsaKey
    trusted_comment: str


def key_id_of(der: bytes) -> bytes:
    return hashlib.sha256(der).digest()[:8]


def load_public_key(pem: str, *, name: str) -> EcdsaKey:
    """A PEM public key of a named curve, P-256 or P-384; anything else is KeyMalformed."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    if len(pem.encode()) > MAX_KEY_BYTES:
        raise KeyMalformed(f"{clip(name)}: larger than {MAX_KEY_BYTES} bytes for a public key")
    from cryptography.exceptions import UnsupportedAlgorithm  # noqa: PLC0415

    try:
        key = serialization.load_pem_public_key(pem.encode())
    except (ValueError, TypeError, UnsupportedAlgorithm) as err:  # a FIPS backend: Ed25519
        raise KeyMalformed(f"{clip(name)}: not a PEM public key ({clip(str(err))})") from err
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise KeyMalformed(f"{clip(name)}: not an ECDSA key")
    curves = {curve for curve, _ in ALGORITHMS.values()}
    if key.curve.name not in curves:
        raise KeyMalformed(f"{clip(name)}: curve {clip(key.curve.name)}, not P-256 or P-384")
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return EcdsaKey(key_id_of(der), key.curve.name, der, name)


def parse_signature(text: str | bytes | None) -> EcdsaSignature:
    if not text:
        raise SignatureMissing("the ECDSA signature is missing or empty")
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > MAX_SIGNATURE_BYTES:
        raise SignatureMalformed(f"the ECDSA signature is larger than {MAX_SIGNATURE_BYTES} bytes")
    try:
        lines = raw.decode("utf-8").split("\n")
    except UnicodeDecodeError as err:
        raise SignatureMalformed("the ECDSA signature is not UTF-8 text") from err
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != 4 or not lines[0].startswith("untrusted comment: "):
        raise SignatureMalformed("the ECDSA signature is not four lines as bundle-format says")
    found = SIGNATURE_LINE.fullmatch(lines[1])
    if found is None or not lines[2].startswith("trusted comment: "):
        raise SignatureMalformed("the ECDSA signature's second or third line is malformed")
    comment = lines[2].removeprefix("trusted comment: ")
    if len(comment.encode()) > MAX_COMMENT_BYTES or not BASE64_LINE.fullmatch(lines[3]):
        raise SignatureMalformed("the ECDSA signature's trusted comment or last line is malformed")
    return EcdsaSignature(
        found.group(1), bytes.fromhex(found.group(2)), _b64(found.group(3)), comment,
        _b64(lines[3]),
    )  # fmt: skip


def verify(
    message: bytes, text: str | bytes | None, trusted: Mapping[bytes, EcdsaKey]
) -> EcdsaVerified:
    """The signature of ``message`` and of its trusted comment, by a trusted key."""
    signature = parse_signature(text)
    key = trusted.get(signature.key_id)
    if key is None:
        raise UnknownSigningKey(
            f"ECDSA-signed by key {signature.key_id.hex()}, which is not trusted; install that "
            "public key (PEM) as a trusted key", key_id=signature.key_id,
        )  # fmt: skip
    curve, digest = ALGORITHMS[signature.algorithm]
    if curve != key.curve:
        raise SignatureInvalid(f"the signature says {signature.algorithm}, the key is {key.curve}")
    covered = signature.signature + signature.trusted_comment.encode()
    if not _is_valid(key, digest, signature.signature, message):
        raise SignatureInvalid("the ECDSA signature does not match the manifest")
    if not _is_valid(key, digest, signature.global_signature, covered):
        raise SignatureInvalid("the ECDSA signature's trusted comment was changed")
    return EcdsaVerified(key, signature.trusted_comment)


def sign(message: bytes, private_pem: bytes, *, trusted_comment: str) -> str:
    """A signature file (``bundle create --ecdsa-key``; the tests)."""
    from cryptography.hazmat.primitives import hashes  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    key, public = _private_key(private_pem)
    algorithm = _algorithm_of(public)
    digest: Any = hashes.SHA256() if algorithm.endswith("sha256") else hashes.SHA384()
    first = key.sign(message, ec.ECDSA(digest))
    second = key.sign(first + trusted_comment.encode(), ec.ECDSA(digest))
    return (
        "untrusted comment: ECDSA signature of a nodeagent bundle\n"
        f"{algorithm}:{public.key_id_hex}:{base64.b64encode(first).decode()}\n"
        f"trusted comment: {trusted_comment}\n{base64.b64encode(second).decode()}\n"
    )


def public_key_of(private_pem: bytes, *, name: str = "") -> EcdsaKey:
    """The public half of a signing key (``bundle create`` shows its id), checked as
    ``sign`` checks it."""
    return _private_key(private_pem, name=name)[1]


def _private_key(private_pem: bytes, *, name: str = "") -> tuple[Any, EcdsaKey]:
    """The EC private key of a PEM (PKCS#8 or SEC1, unencrypted) and its public key;
    anything else is ``KeyMalformed``."""
    from cryptography.exceptions import UnsupportedAlgorithm  # noqa: PLC0415
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    what = f"the ECDSA signing key {clip(name, 200)}".rstrip()
    if len(private_pem) > MAX_KEY_BYTES:
        raise KeyMalformed(f"{what} is larger than {MAX_KEY_BYTES} bytes for a private key")
    try:
        key = serialization.load_pem_private_key(private_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as err:
        raise KeyMalformed(
            f"{what} is not an unencrypted PEM private key ({clip(str(err), 200)}); make one "
            "with `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`"
        ) from err
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise KeyMalformed(f"{what} is not an EC private key")
    if key.curve.name not in {curve for curve, _ in ALGORITHMS.values()}:
        raise KeyMalformed(f"{what}: curve {clip(key.curve.name)}, not P-256 or P-384")
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return key, EcdsaKey(key_id_of(der), key.curve.name, der, name)


@dataclass(frozen=True, slots=True)
class ManifestVerified:
    """Who signed a manifest, as the rest of the node sees it (``verify_signatures``)."""

    key_id_hex: str
    """The key the anti-rollback marks are held under, shown as minisign shows key ids
    (``minisign.key_id_hex``; an ECDSA key's 8-byte id likewise): minisign's key when its
    signature was verified, else the ECDSA key."""
    key_name: str | None
    trusted_comment: str
    schemes: tuple[str, ...]
    """``minisign``, the ECDSA algorithm, or both (minisign first)."""
    linked: tuple[str, ...] = ()
    """The other key that signed the same bytes (both verified: the ECDSA key). The stamp
    links the two (``freshness.with_links``), so stripping one signature from an older
    bundle never escapes the other key's high-water mark."""


def verify_signatures(
    message: bytes,
    *,
    minisig: str | bytes | None,
    ecdsa: str | bytes | None,
    minisign_keys: Mapping[bytes, minisign.PublicKey],
    ecdsa_keys: Mapping[bytes, EcdsaKey],
    host_fips: bool | None,
) -> ManifestVerified:
    """Decision 0075's rule. On a host in FIPS mode the ECDSA signature is required and
    minisign's is not looked at; elsewhere either one by a trusted key is enough, and when
    both are there both must verify and carry the same trusted comment (never half-trusted).
    minisign's must be prehashed (a bundle's always is)."""
    if host_fips:
        if not ecdsa:
            raise Ed25519Refused(
                "this host is in FIPS mode and the bundle has no ECDSA signature: only its "
                "minisign (Ed25519) one, which FIPS does not approve; re-make it with "
                "`bundle create --ecdsa-key`"
            )
        return _ecdsa_verified(verify(message, ecdsa, ecdsa_keys))
    if not ecdsa:
        by = minisign.verify(message, minisig, minisign_keys, is_legacy_allowed=False)
        return ManifestVerified(by.key_id_hex, by.key_name, by.trusted_comment, ("minisign",))
    verified = verify(message, ecdsa, ecdsa_keys)
    if not minisig:
        return _ecdsa_verified(verified)
    by = minisign.verify(message, minisig, minisign_keys, is_legacy_allowed=False)
    if by.trusted_comment != verified.trusted_comment:
        raise SignatureInvalid("the minisign and ECDSA signatures carry different comments")
    ecdsa_id = minisign.key_id_hex(verified.key.key_id)
    algorithm = _algorithm_of(verified.key)
    linked = (ecdsa_id,) if ecdsa_id != by.key_id_hex else ()
    return ManifestVerified(
        by.key_id_hex, by.key_name, by.trusted_comment, ("minisign", algorithm), linked
    )


def verify_manifest(
    message: bytes,
    *,
    minisig: str | bytes | None,
    ecdsa: str | bytes | None,
    minisign_keys: Mapping[bytes, minisign.PublicKey],
    ecdsa_keys: Mapping[bytes, EcdsaKey],
    host_fips: bool | None,
) -> str:
    """``verify_signatures``' trusted comment."""
    return verify_signatures(
        message, minisig=minisig, ecdsa=ecdsa, minisign_keys=minisign_keys,
        ecdsa_keys=ecdsa_keys, host_fips=host_fips,
    ).trusted_comment  # fmt: skip


def load_trusted_keys(texts: Mapping[str, str]) -> dict[bytes, EcdsaKey]:
    """Named PEM public keys into a key-id index; two names for one key id is an error."""
    keys: dict[bytes, EcdsaKey] = {}
    for name, text in texts.items():
        key = load_public_key(text, name=name)
        other = keys.get(key.key_id)
        if other is not None:
            raise KeyMalformed(
                f"trusted keys '{clip(other.name, 100)}' and '{clip(name, 100)}' have the "
                f"same key id {key.key_id_hex}: remove one of them"
            )
        keys[key.key_id] = key
    return keys


def _ecdsa_verified(verified: EcdsaVerified) -> ManifestVerified:
    key = verified.key
    return ManifestVerified(
        minisign.key_id_hex(key.key_id), key.name, verified.trusted_comment,
        (_algorithm_of(key),),
    )  # fmt: skip


def _algorithm_of(key: EcdsaKey) -> str:
    return next(a for a, (curve, _) in ALGORITHMS.items() if curve == key.curve)


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise SignatureMalformed("the ECDSA signature is not valid base64") from err


def _is_valid(key: EcdsaKey, digest: str, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    public = serialization.load_der_public_key(key.der)
    if not isinstance(public, ec.EllipticCurvePublicKey):  # load_public_key made it: never
        raise KeyMalformed(f"{clip(key.name)}: not an ECDSA key")
    algorithm: Any = hashes.SHA256() if digest == "sha256" else hashes.SHA384()
    try:
        public.verify(signature, data, ec.ECDSA(algorithm))
    except InvalidSignature:
        return False
    return True
