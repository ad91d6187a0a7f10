"""Registry credentials from a docker config JSON (the kubelet's pull secret), pure.

The file is ``{"auths": {KEY: ENTRY, ...}}``. ``ENTRY`` carries ``auth``
(base64 of ``user:password``), or ``username``/``password``, and optionally
``identitytoken`` / ``registrytoken``. ``KEY`` names a registry (``quay.io``,
``127.0.0.1:5000``), a namespace or repository in it (``quay.io/team``,
``quay.io/team/app``), a legacy URL (``https://index.docker.io/v1/``), or a
kubelet-style wildcard host (``*.example.com``).

Lookup follows the kubelet and containers-image: keys are normalized (scheme
dropped; ``/v1/``, ``/v2/`` API paths and trailing slashes dropped; Docker Hub
aliases folded into ``docker.io``), a key matches an image when its host
matches and its path segments are a prefix of the image's repository, and the
most specific key wins (most path segments, then a literal host over a
wildcard, then the key written in normalized form, then file order).

The file is read strictly (``nodeagent.strict.loads_json``: UTF-8, no duplicate keys,
at most ``MAX_AUTH_FILE_BYTES``, nested at most ``MAX_AUTH_FILE_DEPTH`` deep). Each
entry's fields are strings of at most ``MAX_FIELD_CHARS``; ``auth`` must be base64 (ASCII,
padded) of UTF-8 ``username:password``; the tokens, which go into a header as they are,
visible ASCII only. A file with one bad entry is refused whole (``AuthFileInvalid``
naming the file and the entry's key, clipped): reading the other entries would silently
change which credentials an image gets (a broader key would answer for it), so nothing is
guessed; the caller keeps using no credentials from this file until it is fixed.

No secret ever reaches an error message or a ``repr``: errors name the file and
the key, and are raised ``from None`` so that no decoding exception (which holds
the undecoded text) travels with them. Reading the file is the caller's job; a
missing file is ``AuthStore.empty(source)``.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.errors import AuthFileInvalid
from nodeagent.ports import RegistryCredentials
from nodeagent.registries import normalize_registry, parse_docker_reference
from nodeagent.strict import MalformedInput, loads_json, quoted

MAX_AUTH_FILE_BYTES: Final = 4 * 1024 * 1024
"""A larger auth file is refused; a pull secret with hundreds of registries is ~100 KiB."""
MAX_AUTH_FILE_DEPTH: Final = 16
"""Nesting of the auth file; it is three deep (plus what tools add in fields ignored here)."""
MAX_FIELD_CHARS: Final = 16 * 1024
"""A longer ``auth``, user name, password or token is refused."""
_API_PATHS: Final = frozenset({"v1", "v2"})
_BASE64: Final = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_HEADER_TEXT: Final = re.compile(r"[\x21-\x7e]*")
_TOKEN_FIELDS: Final = {"identitytoken": "identity_token", "registrytoken": "registry_token"}


@dataclass(frozen=True, slots=True)
class AuthEntry:
    """One key of the file, parsed: ``host`` (may hold ``*`` labels) and path ``segments``."""

    key: str
    host: str
    segments: tuple[str, ...]
    credentials: RegistryCredentials

    @property
    def has_wildcard(self) -> bool:
        return "*" in self.host

    def matches(self, host: str, segments: tuple[str, ...]) -> bool:
        return _host_matches(self.host, host) and segments[: len(self.segments)] == self.segments

    def specificity(self) -> tuple[int, bool, bool]:
        """Sort key: most specific first."""
        is_exact_key = self.key == "/".join((self.host, *self.segments))
        return (-len(self.segments), self.has_wildcard, not is_exact_key)


@dataclass(frozen=True, slots=True)
class AuthStore:
    """The entries of one auth file, most specific first."""

    source: str
    entries: tuple[AuthEntry, ...] = ()

    @classmethod
    def empty(cls, source: str) -> AuthStore:
        """The store for a missing file: every lookup is anonymous."""
        return cls(source)

    def __len__(self) -> int:
        return len(self.entries)

    def credentials_for(self, image_ref: str) -> RegistryCredentials | None:
        """Credentials of the most specific key matching ``image_ref``, or None (anonymous)."""
        ref = parse_docker_reference(image_ref)
        segments = tuple(ref.repository.split("/"))
        for entry in self.entries:
            if entry.matches(ref.registry, segments):
                return entry.credentials
        return None


def parse_auth_file(text: str | bytes, *, source: str) -> AuthStore:
    """Parse a docker config JSON; ``source`` (the path) names the file in errors."""
    if not text.strip():
        return AuthStore.empty(source)
    try:
        doc = loads_json(text, what=source, max_bytes=MAX_AUTH_FILE_BYTES,
                         max_depth=MAX_AUTH_FILE_DEPTH)  # fmt: skip
    except MalformedInput as err:
        # Messages of loads_json show positions and key names, never string values.
        raise AuthFileInvalid(f"{err}; fix the file") from None
    auths = doc.get("auths", {}) if isinstance(doc, dict) else None
    if not isinstance(auths, dict):
        raise AuthFileInvalid(f"{source}: expected an object with an 'auths' object")
    entries = [_entry(source, key, value) for key, value in auths.items()]
    usable = [entry for entry in entries if entry is not None]
    return AuthStore(source, tuple(sorted(usable, key=AuthEntry.specificity)))


def normalize_key(key: str) -> tuple[str, tuple[str, ...]]:
    """``(host, path segments)`` of an ``auths`` key, normalized for matching."""
    stripped = key.strip()
    for scheme in ("https://", "http://"):
        stripped = stripped.removeprefix(scheme)
    host, _, path = stripped.partition("/")
    segments = tuple(part for part in path.split("/") if part)
    if segments and segments[0] in _API_PATHS:
        segments = ()  # an API URL (https://index.docker.io/v1/) names the whole registry
    return normalize_registry(host), segments


def _entry(source: str, key: str, value: Any) -> AuthEntry | None:
    where = f"{source}: auths[{quoted(key, 120)}]"
    if not isinstance(value, dict):
        raise AuthFileInvalid(f"{where} must be an object")
    host, segments = normalize_key(key)
    if not host:
        raise AuthFileInvalid(f"{where}: the key names no registry host")
    fields = _credential_fields(where, value)
    if not any(fields.values()):
        return None  # e.g. only "email": nothing to authenticate with
    server = "/".join((host, *segments))
    return AuthEntry(key, host, segments, RegistryCredentials(server_address=server, **fields))


def _credential_fields(where: str, value: Mapping[str, Any]) -> dict[str, str]:
    raw = {name: value.get(name, "") for name in ("auth", "username", "password", *_TOKEN_FIELDS)}
    for name, field_value in raw.items():
        if not isinstance(field_value, str):
            raise AuthFileInvalid(f"{where}: {name!r} must be a string")
        if len(field_value) > MAX_FIELD_CHARS:
            raise AuthFileInvalid(f"{where}: {name!r} is longer than {MAX_FIELD_CHARS} characters")
    for name in _TOKEN_FIELDS:
        if not _HEADER_TEXT.fullmatch(raw[name]):
            raise AuthFileInvalid(
                f"{where}: {name!r} holds white space, control or non-ASCII characters"
            )
    fields = {
        "auth": raw["auth"].strip(),
        "username": raw["username"],
        "password": raw["password"],
        **{attr: raw[name] for name, attr in _TOKEN_FIELDS.items()},
    }
    if raw["auth"]:
        fields["username"], fields["password"] = _decode_auth(where, raw["auth"])
    return fields


def _decode_auth(where: str, auth: str) -> tuple[str, str]:
    """Split base64 ``user:password``; errors say what is wrong, never what was there."""
    text = auth.strip()
    if not _BASE64.fullmatch(text) or len(text) % 4:  # non-ASCII too: b64decode's ValueError
        raise AuthFileInvalid(f"{where}: 'auth' is not base64 (A-Z, a-z, 0-9, +, /, = padding)")
    try:
        decoded = base64.b64decode(text, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise AuthFileInvalid(f"{where}: 'auth' is not base64 of UTF-8 text") from None
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in decoded):
        raise AuthFileInvalid(f"{where}: 'auth' decodes to text with control characters")
    username, colon, password = decoded.partition(":")
    if not colon or not username:
        raise AuthFileInvalid(f"{where}: 'auth' must be base64 of 'username:password'")
    return username, password


def _host_matches(pattern: str, host: str) -> bool:
    """Exact match, or kubelet's ``*`` per DNS label (same label count, same port)."""
    if "*" not in pattern:
        return pattern == host
    pattern_name, _, pattern_port = pattern.partition(":")
    name, _, port = host.partition(":")
    labels, wanted = name.split("."), pattern_name.split(".")
    if port != pattern_port or len(labels) != len(wanted):
        return False
    return all(fnmatch.fnmatchcase(label, glob) for label, glob in zip(labels, wanted, strict=True))
