"""Secrets out of what ``nodeagent support-dump`` collects (pure; decision 0072).

nodeagent's configuration holds no secret itself: credentials, tokens and private keys
live in the files it names (``[pull] auth_file``, ``[cluster] kubeconfig``, ``[site]
key_file``, …), and the dump never opens those. What could still carry one is redacted:

* a value whose key names a secret (``password``, ``token``, ``secret``, ``credential``,
  ``bearer``, ``private``, or a key ending in ``auth``): ``<redacted>`` (``redact_doc``);
* the user information of a URL (``https://user:pass@host``), anywhere
  (``redact_text``);
* in free text (the journal), ``password=…``, ``token: …``, ``Authorization: Bearer …`` and
  the like, and a PEM private key block (``redact_text``).

The dump is also built from the effective configuration (``dataclasses.asdict``), never
the files' text, so a comment in a config file never reaches it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

REDACTED: Final = "<redacted>"

_SECRET_KEY: Final = re.compile(r"pass|token|secret|credential|bearer|private|auth$", re.I)
_URL_USERINFO: Final = re.compile(r"(?<=://)[^/@\s]{1,1024}@")
_PAIR: Final = re.compile(
    r"(?i)\b((?:[a-z0-9_-]{0,64})(?:password|passwd|token|secret|credential)s?)"
    r"(\s{0,4}[=:]\s{0,4})(\"[^\"]{0,4096}\"|'[^']{0,4096}'|[^\s,;}\]]{1,4096})"
)
_BEARER: Final = re.compile(r"(?i)\b(authorization\s{0,4}[=:]\s{0,4}(?:bearer|basic)\s)\S{1,4096}")
_PEM: Final = re.compile(
    r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----.{0,65536}?"
    r"(?:-----END [A-Z ]{0,40}PRIVATE KEY-----|$)",
    re.S,
)


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def redact_text(text: str) -> str:
    """``text`` with URL user information, ``key=value`` secrets, authorization headers
    and PEM private keys replaced by ``<redacted>`` (linear time: every repeat is bounded)."""
    text = _PEM.sub(REDACTED, text)
    text = _URL_USERINFO.sub(f"{REDACTED}@", text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    return _PAIR.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)


def redact_doc(value: object, key: str = "") -> object:
    """A JSON-like document with every secret value replaced (``is_secret_key`` by the key
    that names it; ``redact_text`` on every other string)."""
    if isinstance(value, Mapping):
        return {str(k): redact_doc(v, str(k)) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [redact_doc(v, key) for v in value]
    if isinstance(value, str | bytes) and key and is_secret_key(key) and value:
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    return value
