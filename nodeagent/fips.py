"""Is this node in FIPS mode, and can it verify the Ed25519 (minisign) signatures of bundles
with the crypto backend nodeagent uses? (docs/decisions/0075-fips-and-bundle-signatures.md)

Pure parts first: the posture as a value, its reason code, its status document and its one
line for ``check-config``. Then the known-answer test of Ed25519 through ``cryptography``
(RFC 8032, section 7.1, TEST 1), which reports a refusal instead of raising: an OpenSSL
FIPS provider refuses Ed25519 (docs/runtime-facts.md, "FIPS"), and ``cryptography`` then
raises ``UnsupportedAlgorithm`` where a key is loaded.

Host interfaces: none here; ``/proc/sys/crypto/fips_enabled`` is read by
``nodeagent.adapters.fips``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

Ed25519State = Literal["verifies", "refused", "not-checked"]

ED25519_REFUSED: Final = "Ed25519Refused"
"""The reason code when the backend refuses Ed25519 (``errors.Ed25519Refused``)."""

# RFC 8032, 7.1, TEST 1: the empty message signed with the first test key.
KAT_PUBLIC_KEY: Final = bytes.fromhex(
    "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
)
KAT_SIGNATURE: Final = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9"
    "b46bd25bf5f0595bbe24655141438e7a100b"
)
MAX_DETAIL_CHARS: Final = 200


@dataclass(frozen=True, slots=True)
class CryptoPosture:
    """What the node and the crypto backend say about FIPS and Ed25519."""

    host_fips: bool | None
    """``/proc/sys/crypto/fips_enabled`` is 1 (True) or 0 (False); None: the file is absent
    or unreadable (a kernel without the FIPS switch): unknown, never taken for off."""
    backend: str
    """The crypto backend: ``cryptography`` VERSION with OpenSSL VERSION, or ``not loaded``."""
    backend_fips: bool | None
    """The backend's own FIPS mode (``cryptography``'s backend says it); None: not loaded, or a
    ``cryptography`` that does not say."""
    ed25519: Ed25519State
    """The known-answer test: ``verifies``, ``refused`` or ``not-checked`` (the daemon checks
    only on a FIPS host, so that an idle node does not load the backend; decision 0069)."""
    detail: str = ""
    """Why the test failed, as the backend said it (clipped)."""

    @property
    def reason(self) -> str | None:
        """``Ed25519Refused`` when bundles cannot be verified here, else None."""
        return ED25519_REFUSED if self.ed25519 == "refused" else None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "hostFips": self.host_fips,
            "backend": self.backend,
            "backendFips": self.backend_fips,
            "ed25519": self.ed25519,
        }
        if self.reason is not None:
            doc["reason"] = self.reason
            doc["message"] = refusal_message(self)
        return doc


def host_fips_word(host_fips: bool | None) -> str:
    return {True: "on", False: "off", None: "unknown"}[host_fips]


def refusal_message(posture: CryptoPosture) -> str:
    where = "this FIPS-mode host" if posture.host_fips else "this host"
    said = f" ({posture.detail})" if posture.detail else ""
    return (
        f"the crypto backend ({posture.backend}) refuses Ed25519 on {where}{said}: no "
        "minisign-signed bundle can be verified here; bundles signed with ECDSA too (`bundle "
        "create --ecdsa-key`) are, by a trusted .pem key (decision 0075)"
    )


def posture_line(posture: CryptoPosture) -> str:
    """``check-config``'s line, e.g. ``crypto: FIPS mode off; Ed25519 verifies (...)``."""
    ed25519 = {"verifies": "verifies", "refused": "REFUSED", "not-checked": "not checked"}
    own = posture.backend_fips
    backend_fips = "" if own is None else f" (FIPS mode {host_fips_word(own)})"
    return (
        f"crypto: FIPS mode {host_fips_word(posture.host_fips)}; Ed25519 "
        f"{ed25519[posture.ed25519]} with {posture.backend}{backend_fips}"
    )


def probe(host_fips: bool | None) -> CryptoPosture:
    """Load ``cryptography`` and run the Ed25519 known-answer test through it; a library that
    cannot be loaded (a distribution without it, a broken install) refuses too."""
    try:
        return _probe(host_fips)
    except ImportError as err:
        detail = f"cannot load cryptography: {err}"[:MAX_DETAIL_CHARS]
        return CryptoPosture(host_fips, "cryptography not loadable", None, "refused", detail)


def _probe(host_fips: bool | None) -> CryptoPosture:
    from cryptography import __version__ as version  # noqa: PLC0415  (loaded here only)
    from cryptography.exceptions import (  # noqa: PLC0415
        InternalError,
        InvalidSignature,
        UnsupportedAlgorithm,
    )
    from cryptography.hazmat.backends.openssl.backend import backend  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )

    described = f"cryptography {version} with {backend.openssl_version_text()}"
    # cryptography has no public one; an older or newer release without it: unknown
    own = getattr(backend, "_fips_enabled", None)
    backend_fips = None if own is None else bool(own)
    state: Ed25519State = "verifies"
    detail = ""
    try:
        Ed25519PublicKey.from_public_bytes(KAT_PUBLIC_KEY).verify(KAT_SIGNATURE, b"")
    # ValueError: what cryptography's own OpenSSL raises for the valid 32-byte key when its
    # default properties ask for FIPS (fips=yes) and no provider offers Ed25519.
    except (UnsupportedAlgorithm, InternalError, InvalidSignature, ValueError) as err:
        state, detail = "refused", f"{type(err).__name__}: {err}"[:MAX_DETAIL_CHARS]
    return CryptoPosture(host_fips, described, backend_fips, state, detail)


def not_checked(host_fips: bool | None) -> CryptoPosture:
    """The posture without loading the backend (a host not in FIPS mode, at idle)."""
    return CryptoPosture(host_fips, "not loaded", None, "not-checked")
