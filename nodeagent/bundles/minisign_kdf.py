"""A minisign secret key's encryption (scrypt, ``minisign -G`` without -W): the key stream
the key's body is XORed with, from the password and the salt and limits in the key's header.

Written from the public format description (https://jedisct1.github.io/minisign/), as
``nodeagent.bundles.minisign``, which parses and uses the keys.
"""

from __future__ import annotations

import hashlib

from nodeagent.errors import KeyMalformed, SecretKeyLocked

# minisign's "sensitive" scrypt preset, the one `minisign -G` uses: the most we agree to spend.
SCRYPT_OPSLIMIT_MAX = 1 << 25
SCRYPT_MEMLIMIT_MAX = 1 << 30


def password_bytes(password: str | bytes | None) -> bytes:
    if password is None:
        raise SecretKeyLocked("secret key is encrypted: give its password")
    return password.encode() if isinstance(password, str) else password


def scrypt_stream(raw: bytes, password: bytes, size: int) -> bytes:
    """``size`` bytes of scrypt(password) with the salt and limits of the secret key ``raw``."""
    salt = raw[6:38]
    opslimit = int.from_bytes(raw[38:46], "little")
    memlimit = int.from_bytes(raw[46:54], "little")
    if opslimit > SCRYPT_OPSLIMIT_MAX or memlimit > SCRYPT_MEMLIMIT_MAX:
        raise KeyMalformed(
            f"secret key: scrypt limits (ops {opslimit}, memory {memlimit} bytes) exceed "
            "minisign's 'sensitive' preset; re-encrypt it with `minisign -C`"
        )
    n_log2, r, p = scrypt_parameters(opslimit, memlimit)
    if p < 1:
        raise KeyMalformed("secret key: scrypt limits too small to derive a key")
    maxmem = 128 * r * ((1 << n_log2) + 2 + p) + (1 << 20)
    return hashlib.scrypt(password, salt=salt, n=1 << n_log2, r=r, p=p, maxmem=maxmem, dklen=size)


def scrypt_parameters(opslimit: int, memlimit: int) -> tuple[int, int, int]:
    """(log2 N, r, p) for libsodium's scryptsalsa208sha256 limits, as minisign derives them."""
    opslimit = max(opslimit, 32768)
    r = 8
    if opslimit < memlimit // 32:
        n_log2 = _n_log2(opslimit // (r * 4))
        return n_log2, r, 1
    n_log2 = _n_log2(memlimit // (r * 128))
    max_rp = min((opslimit // 4) >> n_log2, 0x3FFFFFFF)
    return n_log2, r, max_rp // r


def _n_log2(max_n: int) -> int:
    """The smallest n >= 1 with 2**n > max_n // 2 (at most 63)."""
    return min(max(1, (max_n // 2).bit_length()), 63)
