"""Manifest facts by digest, for the registry client: in memory and, optionally, on disk.

Manifests by digest never change, so ``ManifestCache`` keeps what admission
needs (sizes, and which index entry this platform takes) forever: in memory
and, given a directory, as one small JSON file per digest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from nodeagent.adapters.files import set_aside, write_atomic
from nodeagent.errors import HostFileError, StateFileDamaged
from nodeagent.registries import ImageManifest, Platform, is_sha256_digest
from nodeagent.strict import clip

log = structlog.get_logger(__name__)


def _image_key(digest: str) -> str:
    return digest.replace(":", "-")


def _child_key(digest: str, platform: Platform) -> str:
    return f"{_image_key(digest)}.{str(platform).replace('/', '-')}"


def _entry_from_json(doc: Any) -> ImageManifest | str:
    if "child" in doc:
        child = doc["child"]
        if not isinstance(child, str) or not is_sha256_digest(child):
            raise ValueError(f"bad child digest {child!r}")
        return child
    layers = tuple((str(digest), int(size)) for digest, size in doc["layers"])
    return ImageManifest(int(doc["config_size_bytes"]), layers)


class ManifestCache:
    """Manifest facts by digest, kept forever: they cannot change.

    Entries are ``ImageManifest`` (config and layer sizes) per image-manifest
    digest, and the chosen child digest per ``(index digest, platform)``. With
    ``directory``, each entry is also one JSON file there, written atomically,
    and read back by later processes; an unreadable file counts as a miss.
    Methods block on file I/O when a directory is set: call them from a thread.
    """

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self._entries: dict[str, ImageManifest | str] = {}

    def get(self, digest: str, platform: Platform) -> ImageManifest | str | None:
        """The image manifest for ``digest``, the child to follow for an index, or None."""
        for key in (_image_key(digest), _child_key(digest, platform)):
            found = self._entries.get(key)
            if found is None:
                found = self._load(key)
            if found is not None:
                self._entries[key] = found
                return found
        return None

    def put_image(self, digest: str, manifest: ImageManifest) -> None:
        key = _image_key(digest)
        self._entries[key] = manifest
        doc = {"config_size_bytes": manifest.config_size_bytes, "layers": manifest.layers}
        self._store(key, doc)

    def put_child(self, digest: str, platform: Platform, child_digest: str) -> None:
        key = _child_key(digest, platform)
        self._entries[key] = child_digest
        self._store(key, {"child": child_digest})

    def _load(self, key: str) -> ImageManifest | str | None:
        """The entry on disk; a damaged one is set aside (state_file_damaged) and missed."""
        if self.directory is None:
            return None
        path = self.directory / f"{key}.json"
        try:
            doc = json.loads(path.read_bytes())
            return _entry_from_json(doc)
        except FileNotFoundError:
            return None
        except (IsADirectoryError, ValueError, TypeError, KeyError, IndexError) as err:
            self._set_aside(path, clip(str(err) or type(err).__name__, 200))
            return None
        except OSError as err:
            log.warning("manifest_cache_entry_ignored", entry=key, error=str(err))
            return None

    def _set_aside(self, path: Path, error: str) -> None:
        moved = None
        try:
            moved = set_aside(path)
        except HostFileError as failed:
            log.warning("state_file_not_moved", file=str(path), error=failed.message)
        log.warning(
            "state_file_damaged",
            file=str(path),
            reason=StateFileDamaged.reason,
            error=f"manifest cache entry {path.name} cannot be decoded: {error}",
            moved_to=None if moved is None else str(moved),
        )

    def _store(self, key: str, doc: Mapping[str, Any]) -> None:
        if self.directory is None:
            return
        data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        try:
            write_atomic(self.directory / f"{key}.json", data, mode=0o644)
        except HostFileError as err:
            log.warning("manifest_cache_write_failed", entry=key, error=err.message)
