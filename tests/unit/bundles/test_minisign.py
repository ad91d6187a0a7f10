"""Unit tests of the minisign module, against vectors made by Debian's minisign 0.11.

The GOLDEN_* texts were written by `minisign -G -W`, `minisign -S` and `minisign -S -l`
(see tests/integration/bundles/test_minisign.py for the same checks against the live binary).
"""

from __future__ import annotations

import base64
import hashlib
import io

import pytest

from nodeagent.bundles import minisign, minisign_kdf
from nodeagent.bundles.minisign import PublicKey
from nodeagent.errors import (
    KeyMalformed,
    PermanentError,
    SecretKeyLocked,
    SignatureInvalid,
    SignatureLegacy,
    SignatureMalformed,
    SignatureMissing,
    UnknownSigningKey,
)

GOLDEN_KEY_ID_HEX = "BE3392E79592523F"
GOLDEN_PUB = """untrusted comment: minisign public key BE3392E79592523F
RWQ/UpKV55IzvosvdXdSGrRI3LOJC6Nk8mVxu/nC+UIvSoC+3kAogSL4
"""
GOLDEN_KEY = """untrusted comment: golden
RWQAAEIyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAP1KSleeSM76QSieKHFBGmoJ4OW+z\
i8WC1FwEyKE5tiEOJ6+e4uW2mIsvdXdSGrRI3LOJC6Nk8mVxu/nC+UIvSoC+3kAogSL4AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\
AAAAAAAAAAA=
"""
GOLDEN_MESSAGE = b"nodeagent golden message\n"
GOLDEN_SIG = """untrusted comment: golden prehashed
RUQ/UpKV55IzvpphjAP4axXfFMZQh+BT+9xKgh6GhqSnYZIsE9nApyD+iqGA6LtFaFkBhmFJxtR/2221xpjbhDB610h2oiZkWwo=
trusted comment: golden trusted comment
+2gOytvuoJc8Tw8zjhpr78OUussRCVWxGlGFW+pO+4KcSvERDgFjlXD2C3f/BIzyiBxzt+FfyhFVlrGNnnpUBw==
"""
GOLDEN_LEGACY_SIG = """untrusted comment: golden legacy
RWQ/UpKV55IzvrKElbQUTz20oPqAD7Mice4YI8mHDRAvfzvGYIbq7YZS4m6x1pK8YMYFiGHrSE0+VbmQ7UnRQBu2y074MLPyegE=
trusted comment: golden legacy comment
RICnYW/zep+PeWvV1ohwI7gklgRh4lpLtIg69JNXA8rA8WX2Bub5L8r6kDw92L/jGU9Z5deTzpIPC00Z3+uHCA==
"""
TRUSTED = minisign.load_trusted_keys({"release": GOLDEN_PUB})


def _lines(text: str) -> list[str]:
    return text.splitlines()


def _replace_line(text: str, index: int, line: str) -> str:
    lines = _lines(text)
    lines[index] = line
    return "\n".join(lines) + "\n"


def _flip_bit(b64_line: str, byte_index: int) -> str:
    raw = bytearray(base64.b64decode(b64_line))
    raw[byte_index] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


class TrickleReader:
    """A stream that returns at most 7 bytes per read, to exercise the read loops."""

    def __init__(self, data: bytes) -> None:
        self._stream = io.BytesIO(data)

    def read(self, size: int = -1, /) -> bytes:
        return self._stream.read(7 if size < 0 else min(size, 7))


# ---------------------------------------------------------------- keys


def test_public_key_id_reads_as_minisign_prints_it() -> None:
    key = minisign.parse_public_key(GOLDEN_PUB, name="release")
    assert key.key_id_hex == GOLDEN_KEY_ID_HEX
    assert key.name == "release"
    assert len(key.public_bytes) == 32


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ("3f529295e79233be", "BE3392E79592523F"),
        ("a1b8b8031dd0430b", "B43D01D03B8B8A1"),  # minisign 0.11 does not pad with zeros
        ("0000000000000000", "0"),
    ],
)
def test_key_id_hex_reads_as_minisign_prints_it(stored: str, shown: str) -> None:
    assert minisign.key_id_hex(bytes.fromhex(stored)) == shown


def test_bare_base64_public_key_line_is_accepted() -> None:
    bare = _lines(GOLDEN_PUB)[1]
    assert minisign.parse_public_key(f"  {bare}\n") == minisign.parse_public_key(GOLDEN_PUB)


def test_secret_key_of_minisign_matches_its_public_key() -> None:
    secret = minisign.parse_secret_key(GOLDEN_KEY)
    assert secret.public_key() == minisign.parse_public_key(GOLDEN_PUB)
    assert "seed" not in repr(secret)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "expected a comment line"),
        ("untrusted comment: x\nAAAA\nAAAA\n", "expected a comment line"),
        ("RWQ/UpKV55Izvo!!", "not valid base64"),
        ("RWQ/UpKV", "holds 6 bytes"),
        ("untrusted comment: x\n" + base64.b64encode(b"Xx" + bytes(40)).decode(), "'Xx'"),
    ],
)
def test_malformed_public_keys(text: str, fragment: str) -> None:
    with pytest.raises(KeyMalformed, match=fragment) as info:
        minisign.parse_public_key(text, name="broken")
    assert "'broken'" in str(info.value)
    assert info.value.reason == "SigningKeyMalformed"


def _golden_secret_raw() -> bytes:
    return base64.b64decode(_lines(GOLDEN_KEY)[1])


def _secret_text(raw: bytes) -> str:
    return f"untrusted comment: test\n{base64.b64encode(raw).decode()}\n"


@pytest.mark.parametrize(
    ("offset", "value", "fragment"),
    [
        (0, b"Xx", "algorithm"),
        (2, b"Zz", "unknown key derivation"),
        (4, b"B3", "unknown checksum"),
        (126, b"\x01", "checksum does not match"),  # a non-zero checksum is checked
        (100, b"\x00", "public half does not match"),  # inside the embedded public key
    ],
)
def test_malformed_secret_keys(offset: int, value: bytes, fragment: str) -> None:
    raw = bytearray(_golden_secret_raw())
    raw[offset : offset + len(value)] = value
    with pytest.raises(KeyMalformed, match=fragment):
        minisign.parse_secret_key(_secret_text(bytes(raw)))


def _encrypt(raw: bytes, password: bytes, *, opslimit: int, memlimit: int, n: int) -> str:
    """Encrypt an unencrypted key with scrypt(N=n, r=8, p=1), the parameters the limits mean."""
    key_id, secret = raw[54:62], raw[62:126]
    checksum = hashlib.blake2b(b"Ed" + key_id + secret, digest_size=32).digest()
    salt = bytes(range(32))
    stream = hashlib.scrypt(password, salt=salt, n=n, r=8, p=1, dklen=104, maxmem=1 << 26)
    body = bytes(a ^ b for a, b in zip(key_id + secret + checksum, stream, strict=True))
    limits = opslimit.to_bytes(8, "little") + memlimit.to_bytes(8, "little")
    return _secret_text(b"EdScB2" + salt + limits + body)


ENCRYPTED = _encrypt(
    _golden_secret_raw(), b"p\xc3\xa4ss", opslimit=1 << 20, memlimit=1 << 25, n=1 << 15
)


def test_encrypted_secret_key_opens_with_its_password() -> None:
    secret = minisign.parse_secret_key(ENCRYPTED, password="päss")
    assert secret == minisign.parse_secret_key(GOLDEN_KEY)


@pytest.mark.parametrize("password", [None, "pass", b""])
def test_encrypted_secret_key_without_the_right_password_is_locked(password: str | None) -> None:
    with pytest.raises(SecretKeyLocked) as info:
        minisign.parse_secret_key(ENCRYPTED, password=password)
    assert info.value.reason == "SigningKeyLocked"


def test_scrypt_limits_beyond_the_sensitive_preset_are_refused() -> None:
    raw = bytearray(base64.b64decode(_lines(ENCRYPTED)[1]))
    raw[46:54] = (1 << 31).to_bytes(8, "little")
    with pytest.raises(KeyMalformed, match="sensitive"):
        minisign.parse_secret_key(_secret_text(bytes(raw)), password="päss")


@pytest.mark.parametrize(
    ("opslimit", "memlimit", "expected"),
    [
        (1 << 25, 1 << 30, (20, 8, 1)),  # minisign -G ("sensitive")
        (1 << 20, 1 << 25, (15, 8, 1)),  # rsign's default
        (1 << 19, 1 << 24, (14, 8, 1)),  # libsodium "interactive"
        (32768, 1 << 30, (10, 8, 1)),  # CPU-bound: N from opslimit
        (0, 1 << 30, (10, 8, 1)),  # opslimit is raised to 32768 first
        (1 << 25, 1 << 24, (14, 8, 64)),  # memory-bound: the rest of the work goes to p
    ],
)
def test_scrypt_parameters(opslimit: int, memlimit: int, expected: tuple[int, int, int]) -> None:
    assert minisign_kdf.scrypt_parameters(opslimit, memlimit) == expected


def test_generated_keypair_parses_and_names_its_key_id() -> None:
    public_text, secret_text = minisign.generate_keypair(comment="test key")
    public = minisign.parse_public_key(public_text)
    secret = minisign.parse_secret_key(secret_text)
    assert secret.public_key() == public
    assert f"minisign public key {public.key_id_hex} (test key)" in public_text
    assert minisign.generate_keypair()[0] != public_text


def test_load_trusted_keys_indexes_by_key_id_and_keeps_names() -> None:
    other_pub, _ = minisign.generate_keypair()
    keys = minisign.load_trusted_keys({"release": GOLDEN_PUB, "other": other_pub})
    assert {key.name for key in keys.values()} == {"release", "other"}
    assert keys[bytes.fromhex(GOLDEN_KEY_ID_HEX)[::-1]].name == "release"


def test_load_trusted_keys_refuses_one_key_id_under_two_names() -> None:
    with pytest.raises(KeyMalformed, match="'a' and 'b' have the same key id BE3392E79592523F"):
        minisign.load_trusted_keys({"a": GOLDEN_PUB, "b": _lines(GOLDEN_PUB)[1]})


# ---------------------------------------------------------------- verify


def test_prehashed_signature_of_minisign_verifies() -> None:
    verified = minisign.verify(GOLDEN_MESSAGE, GOLDEN_SIG, TRUSTED)
    assert verified == minisign.Verified(
        key_id=bytes.fromhex(GOLDEN_KEY_ID_HEX)[::-1],
        trusted_comment="golden trusted comment",
        key_name="release",
        is_prehashed=True,
    )
    assert verified.key_id_hex == GOLDEN_KEY_ID_HEX


def test_legacy_signature_of_minisign_verifies() -> None:
    verified = minisign.verify(GOLDEN_MESSAGE, GOLDEN_LEGACY_SIG.encode(), TRUSTED)
    assert verified.trusted_comment == "golden legacy comment"
    assert not verified.is_prehashed


def test_legacy_signature_is_refused_where_only_prehashed_is_allowed() -> None:
    """Bundles (docs/bundle-format.md R3): refused before any key is looked up."""
    with pytest.raises(SignatureLegacy, match="prehashed") as info:
        minisign.verify(GOLDEN_MESSAGE, GOLDEN_LEGACY_SIG, {}, is_legacy_allowed=False)
    assert info.value.reason == "BundleSignatureLegacy"
    verified = minisign.verify(GOLDEN_MESSAGE, GOLDEN_SIG, TRUSTED, is_legacy_allowed=False)
    assert verified.is_prehashed


@pytest.mark.parametrize("signature", [GOLDEN_SIG, GOLDEN_LEGACY_SIG])
def test_message_may_be_a_stream(signature: str) -> None:
    verified = minisign.verify(TrickleReader(GOLDEN_MESSAGE), signature, TRUSTED)
    assert verified.key_name == "release"


def test_crlf_signature_file_verifies() -> None:
    verified = minisign.verify(GOLDEN_MESSAGE, GOLDEN_SIG.replace("\n", "\r\n"), TRUSTED)
    assert verified.trusted_comment == "golden trusted comment"


def test_legacy_signature_over_a_large_stream_is_refused_unread() -> None:
    with pytest.raises(SignatureMalformed, match="at most 10 bytes"):
        minisign.verify(
            TrickleReader(GOLDEN_MESSAGE), GOLDEN_LEGACY_SIG, TRUSTED, legacy_max_bytes=10
        )


@pytest.mark.parametrize("signature", [GOLDEN_SIG, GOLDEN_LEGACY_SIG])
@pytest.mark.parametrize(
    "message", [GOLDEN_MESSAGE + b"x", GOLDEN_MESSAGE[:-1], b"", b"Nodeagent golden message\n"]
)
def test_altered_message_is_invalid(signature: str, message: bytes) -> None:
    with pytest.raises(SignatureInvalid, match="does not match the signed content") as info:
        minisign.verify(message, signature, TRUSTED)
    assert info.value.reason == "BundleSignatureInvalid"


@pytest.mark.parametrize(
    ("index", "line"),
    [
        (2, "trusted comment: golden trusted comment "),
        (2, "trusted comment: Golden trusted comment"),
        (2, "trusted comment: "),
        (3, _flip_bit(_lines(GOLDEN_SIG)[3], 0)),
        (1, _flip_bit(_lines(GOLDEN_SIG)[1], 40)),  # the signature is part of what's signed
    ],
)
def test_altered_trusted_comment_or_signature_is_invalid(index: int, line: str) -> None:
    with pytest.raises(SignatureInvalid):
        minisign.verify(GOLDEN_MESSAGE, _replace_line(GOLDEN_SIG, index, line), TRUSTED)


def test_untrusted_comment_may_change() -> None:
    edited = _replace_line(GOLDEN_SIG, 0, "untrusted comment: anything at all")
    assert (
        minisign.verify(GOLDEN_MESSAGE, edited, TRUSTED).trusted_comment == "golden trusted comment"
    )


def test_signature_by_another_key_names_its_key_id() -> None:
    other_pub, _ = minisign.generate_keypair()
    others = minisign.load_trusted_keys({"other": other_pub})
    other_hex = next(iter(others.values())).key_id_hex
    with pytest.raises(UnknownSigningKey) as info:
        minisign.verify(GOLDEN_MESSAGE, GOLDEN_SIG, others)
    assert info.value.key_id == bytes.fromhex(GOLDEN_KEY_ID_HEX)[::-1]
    assert f"signed by key {GOLDEN_KEY_ID_HEX}" in str(info.value)
    assert f"{other_hex} (other)" in str(info.value)
    assert info.value.reason == "BundleSignedByUnknownKey"


def test_no_trusted_keys_at_all() -> None:
    with pytest.raises(UnknownSigningKey, match=r"trusted: none"):
        minisign.verify(GOLDEN_MESSAGE, GOLDEN_SIG, {})


def test_same_key_id_with_another_key_is_invalid_not_unknown() -> None:
    impostor_pub, _ = minisign.generate_keypair()
    impostor = minisign.parse_public_key(impostor_pub)
    key_id = bytes.fromhex(GOLDEN_KEY_ID_HEX)[::-1]
    trusted = {key_id: PublicKey(key_id, impostor.public_bytes, "impostor")}
    with pytest.raises(SignatureInvalid):
        minisign.verify(GOLDEN_MESSAGE, GOLDEN_SIG, trusted)


@pytest.mark.parametrize("signature", [None, "", b"", " \n\n", "\r\n"])
def test_missing_signature(signature: str | bytes | None) -> None:
    with pytest.raises(SignatureMissing) as info:
        minisign.verify(GOLDEN_MESSAGE, signature, TRUSTED)
    assert info.value.reason == "BundleUnsigned"


SIG_LINES = _lines(GOLDEN_SIG)


@pytest.mark.parametrize(
    ("signature", "fragment"),
    [
        ("garbage", "has 4 lines, this one has 1"),
        ("\n".join(SIG_LINES[:3]), "this one has 3"),
        ("\n".join([*SIG_LINES, "extra"]), "this one has 5"),
        ("\n".join(["", *SIG_LINES]), "this one has 5"),
        (_replace_line(GOLDEN_SIG, 0, "comment: x"), "'untrusted comment: '"),
        (_replace_line(GOLDEN_SIG, 2, "trusted_comment: x"), "'trusted comment: '"),
        (_replace_line(GOLDEN_SIG, 1, "not base64!"), "signature line is not valid base64"),
        (_replace_line(GOLDEN_SIG, 1, SIG_LINES[1][:-4]), "holds 72 bytes"),
        (_replace_line(GOLDEN_SIG, 3, SIG_LINES[3][4:]), "comment signature holds 61 bytes"),
        (_replace_line(GOLDEN_SIG, 1, "RXo" + SIG_LINES[1][3:]), "neither 'ED' nor 'Ed'"),
        (GOLDEN_SIG.encode().replace(b"golden trusted", b"\xff"), "not UTF-8"),
    ],
)
def test_malformed_signature(signature: str | bytes, fragment: str) -> None:
    with pytest.raises(SignatureMalformed, match=fragment) as info:
        minisign.verify(GOLDEN_MESSAGE, signature, TRUSTED)
    assert info.value.reason == "BundleSignatureMalformed"


# ---------------------------------------------------------------- sign


def test_sign_reproduces_minisign_prehashed_signature() -> None:
    secret = minisign.parse_secret_key(GOLDEN_KEY)
    text = minisign.sign(
        GOLDEN_MESSAGE,
        secret,
        trusted_comment="golden trusted comment",
        untrusted_comment="golden prehashed",
    )
    assert text == GOLDEN_SIG  # Ed25519 is deterministic: byte for byte what minisign wrote


def test_sign_then_verify_a_stream() -> None:
    public_text, secret_text = minisign.generate_keypair()
    message = bytes(range(256)) * 50
    text = minisign.sign(
        TrickleReader(message), minisign.parse_secret_key(secret_text), trusted_comment="t\tü"
    )
    assert _lines(text)[0] == "untrusted comment: signature from minisign secret key"
    trusted = minisign.load_trusted_keys({"new": public_text})
    verified = minisign.verify(io.BytesIO(message), text, trusted)
    assert (verified.trusted_comment, verified.key_name, verified.is_prehashed) == (
        "t\tü",
        "new",
        True,
    )


@pytest.mark.parametrize(
    ("trusted_comment", "untrusted_comment"),
    [("a\nb", "u"), ("a\rb", "u"), ("t", "u\n"), ("x" * 9000, "u")],
)
def test_sign_refuses_comments_that_are_not_one_line(
    trusted_comment: str, untrusted_comment: str
) -> None:
    secret = minisign.parse_secret_key(GOLDEN_KEY)
    with pytest.raises(ValueError, match="minisign comment"):
        minisign.sign(
            b"m", secret, trusted_comment=trusted_comment, untrusted_comment=untrusted_comment
        )


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (SignatureMissing, "BundleUnsigned"),
        (SignatureMalformed, "BundleSignatureMalformed"),
        (UnknownSigningKey, "BundleSignedByUnknownKey"),
        (SignatureInvalid, "BundleSignatureInvalid"),
        (KeyMalformed, "SigningKeyMalformed"),
        (SecretKeyLocked, "SigningKeyLocked"),
    ],
)
def test_errors_are_permanent_with_reason_codes(error: type[PermanentError], reason: str) -> None:
    assert issubclass(error, PermanentError)
    assert error.reason == reason
