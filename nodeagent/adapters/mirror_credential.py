"""The node mirror's credential, as the root daemon keeps it (decision 0057).

Registry-set content is served only to a client that presents a credential of a root-only
auth entry for the mirror's address (``127.0.0.1:22626``). At each start, with ``[mirror]
enabled``, the daemon:

1. reads the mirror's entry from the root-only auth files the node's clients read: CRI-O's
   ``global_auth_file`` (on OpenShift ``/var/lib/kubelet/config.json``, which the
   machine-config-daemon owns: nodeagent never writes it; an administrator adds the entry to
   the cluster's pull secret) and nodeagent's ``[pull] auth_file``;
2. makes sure podman's and skopeo's root file, ``/run/containers/0/auth.json`` (a tmpfs: gone
   at reboot), holds one: when it has none, a random one (``nodeagent-mirror`` and 32 random
   bytes) is added to it, its other entries kept, the file 0600 root. CRI-O without
   a ``global_auth_file`` reads this same file;
3. writes the verifiers of every entry found (``sha256`` of ``user:password``, never the
   password) to ``<run>/peer/mirror-credentials``, 0640 in the peer's group (the directory
   is setgid): the unprivileged peer process compares against them.

A file that is not valid JSON is left untouched and said (``mirror_auth_file_invalid``).
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog

from nodeagent.adapters.files import write_atomic
from nodeagent.authfile import MAX_AUTH_FILE_BYTES, parse_auth_file
from nodeagent.errors import NodeAgentError
from nodeagent.mirror.credentials import (
    MIRROR_USER,
    VERIFIER_NAME,
    render_verifiers,
    verifier_of,
)
from nodeagent.strict import MalformedInput, loads_json

log = structlog.get_logger(__name__)

ROOT_AUTH_FILE: Final = Path("/run/containers/0/auth.json")
"""containers-image's read/write auth file for uid 0 without ``XDG_RUNTIME_DIR`` (podman,
skopeo and CRI-O run as root: docs/runtime-facts.md)."""
PROBE_REPOSITORY: Final = "nodeagent-mirror"


@dataclass(frozen=True, slots=True)
class PublishedCredential:
    verifiers: int
    """Entries found (and their verifiers written)."""
    created: bool
    """Whether an entry was added to ``ROOT_AUTH_FILE``."""


def _read(path: Path) -> bytes | None:
    try:
        with path.open("rb") as stream:
            return stream.read(MAX_AUTH_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning("mirror_auth_file_unreadable", path=str(path), error=str(err))
        return None


def _entry(path: Path, data: bytes, mirror_host: str) -> str | None:
    """The verifier of ``path``'s credential for ``mirror_host``, if it has one."""
    try:
        store = parse_auth_file(data, source=str(path))
    except NodeAgentError as err:
        log.warning("mirror_auth_file_invalid", path=str(path), error=err.message)
        return None
    found = store.credentials_for(f"{mirror_host}/{PROBE_REPOSITORY}@sha256:{'0' * 64}")
    if found is None or (not found.username and not found.password):
        return None
    return verifier_of(found.username, found.password)


def _with_new_entry(data: bytes | None, mirror_host: str) -> tuple[bytes, str] | None:
    """``data`` (an auth file, or none) with a new random entry for ``mirror_host``, and its
    verifier; None when ``data`` is not an auth file to add to (left untouched)."""
    doc: object = {}
    if data is not None and data.strip():
        try:
            doc = loads_json(data, what="auth file", max_bytes=MAX_AUTH_FILE_BYTES)
        except MalformedInput:
            return None
    auths = doc.get("auths", {}) if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(auths, dict):
        return None
    password = secrets.token_urlsafe(32)
    token = base64.b64encode(f"{MIRROR_USER}:{password}".encode()).decode()
    doc["auths"] = {**auths, mirror_host: {"auth": token}}
    return (json.dumps(doc, indent=1) + "\n").encode(), verifier_of(MIRROR_USER, password)


def publish_mirror_credential(
    mirror_host: str,
    verifiers_dir: Path,
    read_only_files: Iterable[Path],
    *,
    root_auth_file: Path = ROOT_AUTH_FILE,
) -> PublishedCredential:
    """Steps 1 to 3 of the module (blocking: run in a thread)."""
    verifiers: list[str] = []
    for path in read_only_files:
        data = _read(path)
        found = None if data is None else _entry(path, data, mirror_host)
        verifiers += [found] if found else []
    data = _read(root_auth_file)
    own = None if data is None else _entry(root_auth_file, data, mirror_host)
    created = False
    if own is None:
        made = _with_new_entry(data, mirror_host)
        if made is None:
            log.warning("mirror_auth_file_invalid", path=str(root_auth_file), error="not JSON")
        else:
            root_auth_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(root_auth_file, made[0], mode=0o600)
            own, created = made[1], True
    verifiers += [own] if own else []
    write_atomic(verifiers_dir / VERIFIER_NAME, render_verifiers(verifiers), mode=0o640)
    log.info(
        "mirror_credential_published",
        mirror=mirror_host,
        entries=len(set(verifiers)),
        created=created,
        auth_file=str(root_auth_file),
    )
    return PublishedCredential(len(set(verifiers)), created)


def withdraw_mirror_credential(verifiers_dir: Path) -> None:
    """``[mirror] enabled = false``: no client can be let in any more."""
    (verifiers_dir / VERIFIER_NAME).unlink(missing_ok=True)
