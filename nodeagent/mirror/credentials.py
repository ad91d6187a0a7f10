"""The node mirror's credential: who may read registry-set content (decision 0057).

Registry-set blobs were pulled with the pull secret, so they are served only to a client
that presents a credential of a root-only auth entry for the mirror's address
(``Authorization: Basic``, as containers-image sends the ``auth.json`` entry of the
mirror's host). The peer process never holds the credential itself: it reads a verifier
file (``VERIFIER_NAME``: one ``sha256:<hex>`` of ``user:password`` a line, at most
``MAX_VERIFIERS``) the root daemon writes, and compares digests in constant time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from typing import Final

VERIFIER_NAME: Final = "mirror-credentials"
"""The verifier file's name, in the peer's report directory (``<run>/peer``)."""
MAX_VERIFIERS: Final = 8
"""Verifiers read (one per auth file that has an entry for the mirror)."""
MAX_VERIFIER_FILE_BYTES: Final = 4096
MAX_AUTHORIZATION_CHARS: Final = 1024
"""Longer ``Authorization`` values are refused unread."""
MIRROR_USER: Final = "nodeagent-mirror"
"""The user name of the entry the daemon creates."""
_VERIFIER: Final = re.compile(r"sha256:[0-9a-f]{64}")


def verifier_of(user: str, password: str) -> str:
    """The verifier of a credential: ``sha256:<hex>`` of ``user:password``."""
    return "sha256:" + hashlib.sha256(f"{user}:{password}".encode()).hexdigest()


def render_verifiers(verifiers: list[str]) -> bytes:
    return "".join(f"{v}\n" for v in sorted(set(verifiers))[:MAX_VERIFIERS]).encode()


def parse_verifiers(data: bytes) -> frozenset[str]:
    """The verifiers of a verifier file; malformed lines are skipped (none: nobody passes)."""
    lines = data[:MAX_VERIFIER_FILE_BYTES].decode("ascii", "replace").splitlines()
    return frozenset(line for line in lines[:MAX_VERIFIERS] if _VERIFIER.fullmatch(line))


def presented_verifier(authorization: str | None) -> str | None:
    """The verifier of a ``Basic`` credential in an ``Authorization`` value, else None."""
    if not authorization or len(authorization) > MAX_AUTHORIZATION_CHARS:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    if b":" not in decoded:
        return None
    return "sha256:" + hashlib.sha256(decoded).hexdigest()


def is_allowed(authorization: str | None, verifiers: frozenset[str]) -> bool:
    """Whether ``authorization`` presents a credential one of ``verifiers`` matches (each
    compared in constant time)."""
    presented = presented_verifier(authorization)
    if presented is None:
        return False
    found = False
    for verifier in verifiers:
        found |= hmac.compare_digest(presented, verifier)
    return found
