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

No secret ever reaches an error message or a ``repr``: errors name the file and
the key, and are raised ``from None`` so that no decoding exception (which holds
the undecoded text) travels with them. Reading the file is the caller's job; a
missing file is ``AuthStore.empty(source)``.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.errors import AuthFileInvalid
from nodeagent.ports import RegistryCredentials
from nodeagent.registries import normalize_registry, parse_docker_reference

_API_PATHS: Final = frozenset({"v1", "v2"})
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


def parse_auth_file(text: str, *, source: str) -> AuthStore:
    """Parse a docker config JSON; ``source`` (the path) names the file in errors."""
    if not text.strip():
        return AuthStore.empty(source)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        # The message has a position but no content; the exception's .doc has everything.
        where = f"line {err.lineno} column {err.colno}"
        raise AuthFileInvalid(f"{source}: not valid JSON ({err.msg} at {where})") from None
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
    where = f"{source}: auths[{key!r}]"
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
    fields = {
        "auth": raw["auth"],
        "username": raw["username"],
        "password": raw["password"],
        **{attr: raw[name] for name, attr in _TOKEN_FIELDS.items()},
    }
    if raw["auth"]:
        fields["username"], fields["password"] = _decode_auth(where, raw["auth"])
    return fields


def _decode_auth(where: str, auth: str) -> tuple[str, str]:
    """Split base64 ``user:password``; errors say what is wrong, never what was there."""
    try:
        decoded = base64.b64decode(auth.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise AuthFileInvalid(f"{where}: 'auth' is not base64 of UTF-8 text") from None
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
