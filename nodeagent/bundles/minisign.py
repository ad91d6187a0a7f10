"""minisign signatures (Ed25519): parse keys and signatures, verify, sign, make key pairs.

Written from the public format description (https://jedisct1.github.io/minisign/); every
text is an ``untrusted comment: ...`` line followed by one base64 line::

    public key   "Ed" || key_id[8] || ed25519_pk[32]
    secret key   "Ed" || kdf "Sc"|"\\0\\0" || "B2" || salt[32] || opslimit[8 LE] || memlimit[8 LE]
                 || (key_id[8] || ed25519_sk[64] || blake2b-256("Ed" || key_id || sk)[32])
                 the last 104 bytes XOR scrypt(password) when the kdf is "Sc"
    signature    "ED" || key_id[8] || ed25519(blake2b-512(message))[64]  ("Ed": of the message)
                 then "trusted comment: <text>" and base64(ed25519(signature[64] || text))

A key id is shown the way minisign shows it: the 8 bytes as a little-endian number in
upper-case hex without leading zeros (``key_id_hex``), as in the public key's comment
"minisign public key <ID>" that minisign 0.11 writes.
Pure: no I/O besides reading a message stream handed in by the caller.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

from nodeagent.bundles.minisign_kdf import (
    SCRYPT_MEMLIMIT_MAX,
    SCRYPT_OPSLIMIT_MAX,
    password_bytes,
    scrypt_stream,
)
from nodeagent.errors import (
    Ed25519Refused,
    KeyMalformed,
    PermanentError,
    SecretKeyLocked,
    SignatureInvalid,
    SignatureLegacy,
    SignatureMalformed,
    SignatureMissing,
    UnknownSigningKey,
)
from nodeagent.strict import clip, quoted

UNTRUSTED_PREFIX = b"untrusted comment: "
TRUSTED_PREFIX = b"trusted comment: "
ALG_LEGACY = b"Ed"  # the public key's algorithm, and a signature of the message itself
ALG_PREHASHED = b"ED"  # a signature of the message's BLAKE2b-512 digest
KDF_SCRYPT = b"Sc"
KDF_NONE = b"\0\0"
CHECKSUM_BLAKE2B = b"B2"
KEY_ID_BYTES = 8
PUBLIC_KEY_BYTES = 2 + KEY_ID_BYTES + 32
SIGNATURE_BYTES = 2 + KEY_ID_BYTES + 64
SECRET_HEADER_BYTES = 2 + 2 + 2 + 32 + 8 + 8
SECRET_BODY_BYTES = KEY_ID_BYTES + 64 + 32
# minisign reads the trusted comment line into an 8 KiB buffer.
TRUSTED_COMMENT_MAX_BYTES = 8192 - len(TRUSTED_PREFIX) - 2
READ_CHUNK_BYTES = 1 << 20
LEGACY_MAX_BYTES = 16 << 20
MAX_SIGNATURE_BYTES = 16 * 1024  # four lines; the trusted comment, the longest, under 8 KiB
MAX_KEY_TEXT_BYTES = 4096  # a key file is two lines of ~100 characters (a secret key ~250)


class Readable(Protocol):
    """A binary stream: ``read(n)`` returns at most n bytes, ``b""`` at the end."""

    def read(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class PublicKey:
    key_id: bytes
    """8 bytes, as stored; ``key_id_hex`` shows them as minisign does."""
    public_bytes: bytes
    """The raw 32-byte Ed25519 public key."""
    name: str | None = None
    """Where the key came from (a trusted key's name), for messages and ``Verified``."""

    @property
    def key_id_hex(self) -> str:
        return key_id_hex(self.key_id)


@dataclass(frozen=True)
class SecretKey:
    key_id: bytes
    seed: bytes = field(repr=False)
    """The 32-byte Ed25519 private key (RFC 8032 seed)."""

    def public_key(self) -> PublicKey:
        return PublicKey(self.key_id, _public_bytes(self.seed))


@dataclass(frozen=True)
class Signature:
    algorithm: bytes
    key_id: bytes
    signature: bytes
    trusted_comment: str
    global_signature: bytes
    untrusted_comment: str


@dataclass(frozen=True)
class Verified:
    key_id: bytes
    trusted_comment: str
    key_name: str | None
    is_prehashed: bool

    @property
    def key_id_hex(self) -> str:
        return key_id_hex(self.key_id)


def key_id_hex(key_id: bytes) -> str:
    """The key id as minisign prints it: a little-endian number in upper-case hex, unpadded."""
    return f"{int.from_bytes(key_id, 'little'):X}"


def parse_public_key(text: str, *, name: str | None = None) -> PublicKey:
    """A ``.pub`` file's text, or its bare base64 line."""
    what = f"public key '{clip(name, 100)}'" if name else "public key"
    raw = _decode_key_line(text, what=what, size=PUBLIC_KEY_BYTES)
    if raw[:2] != ALG_LEGACY:
        raise KeyMalformed(f"{what}: algorithm {raw[:2]!r} is not Ed25519 ('Ed')")
    return PublicKey(raw[2:10], raw[10:], name)


def load_trusted_keys(texts: Mapping[str, str]) -> dict[bytes, PublicKey]:
    """Parse named public keys into a key-id index; two names for one key id is an error."""
    keys: dict[bytes, PublicKey] = {}
    for name, text in texts.items():
        key = parse_public_key(text, name=name)
        other = keys.get(key.key_id)
        if other is not None:
            raise KeyMalformed(
                f"trusted keys '{clip(other.name or '', 100)}' and '{clip(name, 100)}' have the "
                f"same key id {key.key_id_hex}: remove one of them"
            )
        keys[key.key_id] = key
    return keys


def parse_secret_key(text: str, *, password: str | bytes | None = None) -> SecretKey:
    """A ``.key`` file's text as ``minisign -G`` writes it, encrypted (scrypt) or not (-W)."""
    raw = _decode_key_line(text, what="secret key", size=SECRET_HEADER_BYTES + SECRET_BODY_BYTES)
    _check_secret_header(raw)
    body = raw[SECRET_HEADER_BYTES:]
    if raw[2:4] == KDF_SCRYPT:
        body = _xor(body, scrypt_stream(raw, password_bytes(password), SECRET_BODY_BYTES))
    key_id, secret, checksum = body[:8], body[8:72], body[72:]
    if checksum != _checksum(key_id, secret):
        if raw[2:4] == KDF_SCRYPT:
            raise SecretKeyLocked("secret key: wrong password (the key's checksum does not match)")
        if any(checksum):  # minisign 0.11 writes zeros in an unencrypted key
            raise KeyMalformed("secret key: checksum does not match; the file is damaged")
    if _public_bytes(secret[:32]) != secret[32:]:
        raise KeyMalformed("secret key: its public half does not match; the file is damaged")
    return SecretKey(key_id, secret[:32])


def parse_signature(text: str | bytes | None) -> Signature:
    """A ``.minisig`` text: four lines, as described in the module docstring."""
    data = text.encode(errors="replace") if isinstance(text, str) else text
    if data is None or not data.strip():
        raise SignatureMissing("the signature is missing or empty: sign the bundle")
    if len(data) > MAX_SIGNATURE_BYTES:
        raise SignatureMalformed(f"the signature is {len(data)} bytes, more than a minisign one")
    lines = [line.removesuffix(b"\r") for line in data.split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    if len(lines) != 4:
        raise SignatureMalformed(f"a minisign signature has 4 lines, this one has {len(lines)}")
    untrusted, signature_line, trusted, global_line = lines
    raw = _b64(signature_line, SIGNATURE_BYTES, "signature line")
    if raw[:2] not in (ALG_PREHASHED, ALG_LEGACY):
        raise SignatureMalformed(f"signature algorithm {raw[:2]!r} is neither 'ED' nor 'Ed'")
    global_signature = _b64(global_line, 64, "comment signature")
    trusted_comment = _comment(trusted, TRUSTED_PREFIX)
    untrusted_comment = _comment(untrusted, UNTRUSTED_PREFIX)
    return Signature(
        raw[:2], raw[2:10], raw[10:], trusted_comment, global_signature, untrusted_comment
    )


def verify(
    message: bytes | Readable,
    signature_text: str | bytes | None,
    trusted_keys: Mapping[bytes, PublicKey],
    *,
    legacy_max_bytes: int = LEGACY_MAX_BYTES,
    is_legacy_allowed: bool = True,
) -> Verified:
    """Check ``signature_text`` over ``message`` (bytes, or a stream read to its end).

    The key is picked by the signature's key id. A prehashed ("ED") signature streams the
    message through BLAKE2b-512; a legacy ("Ed") one needs the whole message in memory, so
    it is refused for messages over ``legacy_max_bytes``, and always when not
    ``is_legacy_allowed`` (``SignatureLegacy``, before any key is looked up: bundles).
    """
    signature = parse_signature(signature_text)
    if signature.algorithm == ALG_LEGACY and not is_legacy_allowed:
        raise SignatureLegacy(
            "the signature is a legacy (non-prehashed) minisign signature; bundles must be "
            "signed prehashed: sign with nodeagent bundle create, or minisign 0.8 or later "
            "without -l"
        )
    key = _trusted_key(signature.key_id, trusted_keys)
    is_prehashed = signature.algorithm == ALG_PREHASHED
    signed = _blake2b_512(message) if is_prehashed else _read_bounded(message, legacy_max_bytes)
    verifier = _ed25519_public(key.public_bytes)
    if not _is_valid(verifier, signature.signature, signed):
        raise SignatureInvalid(
            f"the signature by key {key.key_id_hex} does not match the signed content: "
            "the content was altered or signed by a different key with the same id"
        )
    comment = signature.signature + signature.trusted_comment.encode()
    if not _is_valid(verifier, signature.global_signature, comment):
        raise SignatureInvalid(
            f"the trusted comment signed by key {key.key_id_hex} was altered: "
            f"{quoted(signature.trusted_comment, 200)} is not what was signed"
        )
    return Verified(key.key_id, signature.trusted_comment, key.name, is_prehashed)


def sign(
    message: bytes | Readable,
    secret_key: SecretKey,
    *,
    trusted_comment: str,
    untrusted_comment: str = "signature from minisign secret key",
) -> str:
    """A prehashed ("ED") ``.minisig`` text, as ``minisign -S`` writes it.

    Comments are single lines; a newline, or a trusted comment over
    ``TRUSTED_COMMENT_MAX_BYTES``, is a ``ValueError`` (the caller builds the comments).
    """
    _check_comment(untrusted_comment, max_bytes=1000)
    _check_comment(trusted_comment, max_bytes=TRUSTED_COMMENT_MAX_BYTES)
    signer = _ed25519_private(secret_key.seed)
    signature = signer.sign(_blake2b_512(message))
    global_signature = signer.sign(signature + trusted_comment.encode())
    signature_line = _b64encode(ALG_PREHASHED + secret_key.key_id + signature)
    comment_line = f"trusted comment: {trusted_comment}"
    return _lines(
        f"untrusted comment: {untrusted_comment}",
        signature_line,
        comment_line,
        _b64encode(global_signature),
    )


def generate_keypair(
    *,
    comment: str = "nodeagent bundle signing key",
    password: bytes | None = None,
    opslimit: int = SCRYPT_OPSLIMIT_MAX,
    memlimit: int = SCRYPT_MEMLIMIT_MAX,
) -> tuple[str, str]:
    """A new key pair as (``.pub`` text, ``.key`` text), as ``minisign -G`` writes them:
    without ``password`` unencrypted (``-W``), with it encrypted by scrypt with ``opslimit``
    and ``memlimit`` (default minisign's own, libsodium's "sensitive" limits)."""
    _check_comment(comment, max_bytes=1000)
    seed = secrets.token_bytes(32)  # an Ed25519 private key is 32 random bytes
    key_id = secrets.token_bytes(KEY_ID_BYTES)
    secret = seed + _public_bytes(seed)
    body = key_id + secret + _checksum(key_id, secret)
    if password is None:
        header = ALG_LEGACY + KDF_NONE + CHECKSUM_BLAKE2B + bytes(32 + 8 + 8)
        kind = "secret key (not encrypted)"
    else:
        limits = opslimit.to_bytes(8, "little") + memlimit.to_bytes(8, "little")
        header = ALG_LEGACY + KDF_SCRYPT + CHECKSUM_BLAKE2B + secrets.token_bytes(32) + limits
        body = _xor(body, scrypt_stream(header, password, SECRET_BODY_BYTES))
        kind = "encrypted secret key"
    public_comment = f"untrusted comment: minisign public key {key_id_hex(key_id)} ({comment})"
    secret_comment = f"untrusted comment: {comment}, {kind}"
    return (
        _lines(public_comment, _b64encode(ALG_LEGACY + key_id + secret[32:])),
        _lines(secret_comment, _b64encode(header + body)),
    )


def _decode_key_line(text: str, *, what: str, size: int) -> bytes:
    if len(text) > MAX_KEY_TEXT_BYTES:
        raise KeyMalformed(f"{what}: {len(text)} characters, a minisign key file is under 4 KiB")
    lines = [line.strip() for line in text.strip().splitlines()]
    if len(lines) == 2 and lines[0].startswith(UNTRUSTED_PREFIX.decode()):
        lines = lines[1:]
    if len(lines) != 1:
        raise KeyMalformed(f"{what}: expected a comment line and a base64 line")
    return _b64(lines[0].encode(errors="replace"), size, what, KeyMalformed)


def _b64(
    line: bytes, size: int, what: str, error: type[PermanentError] = SignatureMalformed
) -> bytes:
    try:
        raw = base64.b64decode(line, validate=True)
    except binascii.Error:
        raise error(f"{what} is not valid base64") from None
    if len(raw) != size:
        raise error(f"{what} holds {len(raw)} bytes, a minisign one holds {size}")
    return raw


def _b64encode(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _lines(*lines: str) -> str:
    return "".join(f"{line}\n" for line in lines)


def _comment(line: bytes, prefix: bytes) -> str:
    if not line.startswith(prefix):
        raise SignatureMalformed(f"a signature line should start with {prefix.decode()!r}")
    try:
        return line.removeprefix(prefix).decode()
    except UnicodeDecodeError:
        raise SignatureMalformed(f"the {prefix.decode()!r} line is not UTF-8") from None


def _check_comment(comment: str, *, max_bytes: int) -> None:
    if "\n" in comment or "\r" in comment:
        raise ValueError(f"a minisign comment is one line: {comment!r}")
    if len(comment.encode()) > max_bytes:
        raise ValueError(f"a minisign comment holds at most {max_bytes} bytes")


def _check_secret_header(raw: bytes) -> None:
    if raw[:2] != ALG_LEGACY:
        raise KeyMalformed(f"secret key: algorithm {raw[:2]!r} is not Ed25519 ('Ed')")
    if raw[2:4] not in (KDF_SCRYPT, KDF_NONE):
        raise KeyMalformed(f"secret key: unknown key derivation {raw[2:4]!r}")
    if raw[4:6] != CHECKSUM_BLAKE2B:
        raise KeyMalformed(f"secret key: unknown checksum algorithm {raw[4:6]!r}")


def _xor(left: bytes, right: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(left, right, strict=True))


def _checksum(key_id: bytes, secret: bytes) -> bytes:
    return hashlib.blake2b(ALG_LEGACY + key_id + secret, digest_size=32).digest()


# cryptography is imported on first use: the idle daemon, which verifies only when a
# stick is plugged in, stays about 7 MiB smaller.
def _ed25519_public(public_bytes: bytes) -> Ed25519PublicKey:
    from cryptography.exceptions import UnsupportedAlgorithm  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )

    try:
        return Ed25519PublicKey.from_public_bytes(public_bytes)
    # An OpenSSL FIPS provider (decision 0075); ValueError for the 32 bytes parsed is what
    # cryptography raises when its properties ask for FIPS and no provider offers Ed25519.
    except (UnsupportedAlgorithm, ValueError) as err:
        raise Ed25519Refused(
            f"the crypto backend refuses Ed25519 ({err}): no minisign signature can be "
            "verified on this node; `nodeagent check-config` shows its FIPS mode"
        ) from err


def _ed25519_private(seed: bytes) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    return Ed25519PrivateKey.from_private_bytes(seed)


def _public_bytes(seed: bytes) -> bytes:
    from cryptography.hazmat.primitives.serialization import (  # noqa: PLC0415
        Encoding,
        PublicFormat,
    )

    return _ed25519_private(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _trusted_key(key_id: bytes, trusted_keys: Mapping[bytes, PublicKey]) -> PublicKey:
    key = trusted_keys.get(key_id)
    if key is not None:
        return key
    known = ", ".join(f"{k.key_id_hex} ({k.name})" for k in trusted_keys.values()) or "none"
    raise UnknownSigningKey(
        f"signed by key {key_id_hex(key_id)}, which is not trusted (trusted: {known}); "
        "install that public key as a trusted key, or re-sign with a trusted key",
        key_id=key_id,
    )


def _is_valid(key: Ed25519PublicKey, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415

    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def _blake2b_512(message: bytes | Readable) -> bytes:
    digest = hashlib.blake2b(digest_size=64)
    if isinstance(message, bytes):
        digest.update(message)
        return digest.digest()
    while chunk := message.read(READ_CHUNK_BYTES):
        digest.update(chunk)
    return digest.digest()


def _read_bounded(message: bytes | Readable, max_bytes: int) -> bytes:
    if isinstance(message, bytes):
        data = message
    else:
        parts: list[bytes] = []
        size = 0
        while size <= max_bytes and (chunk := message.read(max_bytes + 1 - size)):
            parts.append(chunk)
            size += len(chunk)
        data = b"".join(parts)
    if len(data) > max_bytes:
        raise SignatureMalformed(
            f"a legacy (non-prehashed) signature is accepted for at most {max_bytes} bytes; "
            "re-sign with minisign 0.8 or later without -l"
        )
    return data
