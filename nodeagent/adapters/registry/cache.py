"""Manifest facts by digest, for the registry client: in memory and, optionally, on disk.

Manifests by digest never change, so ``ManifestCache`` keeps what admission
needs (sizes, and which index entry this platform takes) forever: in memory
and, given a directory, as one small JSON file per digest. A file is read back
strictly (``nodeagent.strict.loads_json``, at most ``MAX_ENTRY_BYTES``, nested at most
4 deep; digests ``sha256:<64 hex>``, sizes integers from 0 to 2^53 - 1); one that is not
is set aside (``state_file_damaged``) and counts as a miss.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import structlog

from nodeagent.adapters.files import set_aside, write_atomic
from nodeagent.errors import HostFileError, StateFileDamaged
from nodeagent.registries import MAX_SIZE_BYTES, ImageManifest, Platform, is_sha256_digest
from nodeagent.strict import MalformedInput, clip, loads_json

log = structlog.get_logger(__name__)


def _image_key(digest: str) -> str:
    return digest.replace(":", "-")


def _child_key(digest: str, platform: Platform) -> str:
    return f"{_image_key(digest)}.{str(platform).replace('/', '-')}"


MAX_ENTRY_BYTES: Final = 4 * 1024 * 1024
"""A larger cache file is damaged: an entry holds what a 4 MiB manifest can list."""


def _entry_from_json(data: bytes) -> ImageManifest | str:
    """The entry a cache file holds; ``MalformedInput`` when it is not one."""
    doc = loads_json(data, what="the entry", max_bytes=MAX_ENTRY_BYTES, max_depth=4)
    if not isinstance(doc, dict):
        raise MalformedInput("the entry is not a JSON object")
    if "child" in doc:
        child = doc["child"]
        if not isinstance(child, str) or not is_sha256_digest(child):
            raise MalformedInput("'child' is not a sha256:<64 hex> digest")
        return child
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise MalformedInput("'layers' is not a list")
    return ImageManifest(_size(doc.get("config_size_bytes")), tuple(map(_layer, layers)))


def _layer(item: Any) -> tuple[str, int]:
    if not isinstance(item, list) or len(item) != 2:
        raise MalformedInput("a layer is not a [digest, size] pair")
    digest, size = item
    if not isinstance(digest, str) or not is_sha256_digest(digest):
        raise MalformedInput("a layer's digest is not sha256:<64 hex>")
    return digest, _size(size)


def _size(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SIZE_BYTES:
        raise MalformedInput("a size is not an integer from 0 to 2^53-1")
    return value


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
            return _entry_from_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (IsADirectoryError, MalformedInput) as err:
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
            write_atomic(self.directory / f"{key}.json", data, mode=0o640)
        except HostFileError as err:
            log.warning("manifest_cache_write_failed", entry=key, error=err.message)
