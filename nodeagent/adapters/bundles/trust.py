"""The keys that make a bundle authentic on this node, and the one check of a manifest's
signatures (docs/decisions/0075-fips-and-bundle-signatures.md).

``[bundles] trusted_keys_dir`` holds minisign public keys (``*.pub``) and ECDSA public keys
(``*.pem``, PEM SubjectPublicKeyInfo, P-256 or P-384), each named by its file's stem; the
kernel's FIPS switch decides which signatures count. Every reader of a signed manifest (a
medium, ``bundle verify``, the store's copy and its anti-rollback marks, a peer's fetch)
calls ``verify_signed``: nowhere else is a manifest's signature checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from nodeagent.adapters.fips import FIPS_ENABLED_FILE, read_host_fips
from nodeagent.bundles import ecdsa_signature, minisign
from nodeagent.bundles.manifest import ECDSA_SIGNATURE_NAME, SIGNATURE_NAME
from nodeagent.errors import HostFileError, KeyMalformed, SignatureMalformed

TRUSTED_KEY_SUFFIXES: Final = (".pub", ".pem")
"""minisign public keys, and ECDSA ones (PEM SubjectPublicKeyInfo, P-256 or P-384)."""
MAX_KEY_TEXT_BYTES: Final = max(minisign.MAX_KEY_TEXT_BYTES, ecdsa_signature.MAX_KEY_BYTES)
MAX_TRUSTED_KEYS: Final = 256
"""Key files one directory may hold: a site trusts a handful (a rotation adds one)."""


@dataclass(frozen=True)
class TrustedKeys:
    """What makes a bundle authentic on this node: the trusted keys of both schemes, and
    whether the host is in FIPS mode (decision 0075: then only ECDSA counts)."""

    minisign: dict[bytes, minisign.PublicKey] = field(default_factory=dict)
    ecdsa: dict[bytes, ecdsa_signature.EcdsaKey] = field(default_factory=dict)
    host_fips: bool | None = None

    def __len__(self) -> int:
        return len(self.minisign) + len(self.ecdsa)


def load_trusted_keys_dir(directory: Path, *, fips_switch: Path = FIPS_ENABLED_FILE) -> TrustedKeys:
    """The ``*.pub`` minisign keys and the ``*.pem`` ECDSA keys in ``directory``, named by file
    stem (none if it is missing), and the kernel's FIPS switch read from ``fips_switch``."""
    try:
        paths = sorted(p for p in directory.iterdir() if p.name.endswith(TRUSTED_KEY_SUFFIXES))
        texts = {p.name: _read_key(p) for p in paths}
    except FileNotFoundError:
        texts = {}
    except (OSError, UnicodeDecodeError) as err:
        raise HostFileError(
            f"cannot read the trusted keys in {directory}: {err}; check the files' permissions"
        ) from err
    if len(texts) > MAX_TRUSTED_KEYS:
        raise KeyMalformed(
            f"{directory} holds {len(texts)} key files, more than {MAX_TRUSTED_KEYS}: remove "
            "those no longer trusted"
        )
    minisign_texts = {n.removesuffix(".pub"): t for n, t in texts.items() if n.endswith(".pub")}
    ecdsa_texts = {n.removesuffix(".pem"): t for n, t in texts.items() if n.endswith(".pem")}
    return TrustedKeys(
        minisign.load_trusted_keys(minisign_texts),
        ecdsa_signature.load_trusted_keys(ecdsa_texts) if ecdsa_texts else {},
        read_host_fips(fips_switch),
    )


def _read_key(path: Path) -> str:
    """A key file's text; a file over the bound is read only far enough to be refused."""
    with path.open("rb") as stream:
        return stream.read(MAX_KEY_TEXT_BYTES + 1).decode("utf-8", errors="replace")


def kept_signatures(
    verified: ecdsa_signature.ManifestVerified, minisig: bytes | None, ecdsa: bytes | None
) -> tuple[bytes | None, bytes | None]:
    """The signature files to keep beside a stored manifest: those the rule verified (on a
    host in FIPS mode minisign's is not looked at, so not kept: nothing unverified is)."""
    has_ecdsa = any(s != "minisign" for s in verified.schemes)
    return (minisig if "minisign" in verified.schemes else None), (ecdsa if has_ecdsa else None)


def verify_signed(
    data: bytes, minisig: bytes | None, ecdsa: bytes | None, keys: TrustedKeys
) -> ecdsa_signature.ManifestVerified:
    """The one check of a manifest's signatures, wherever it comes from (a medium, the store,
    a peer): decision 0075's rule (``ecdsa_signature.verify_signatures``), each signature
    file bounded first."""
    if minisig is not None and len(minisig) > minisign.MAX_SIGNATURE_BYTES:
        raise SignatureMalformed(f"{SIGNATURE_NAME} is larger than a minisign signature")
    if ecdsa is not None and len(ecdsa) > ecdsa_signature.MAX_SIGNATURE_BYTES:
        raise SignatureMalformed(
            f"{ECDSA_SIGNATURE_NAME} is larger than {ecdsa_signature.MAX_SIGNATURE_BYTES} bytes"
        )
    return ecdsa_signature.verify_signatures(
        data, minisig=minisig, ecdsa=ecdsa, minisign_keys=keys.minisign,
        ecdsa_keys=keys.ecdsa, host_fips=keys.host_fips,
    )  # fmt: skip
