"""The rules a bundle's file tree must follow, and a file's digest check (docs/bundle-format.md,
"The tree").

Pure functions over a description of the tree (``TreeEntry``, as ``lstat`` saw it) and the
verified manifest (``nodeagent.bundles.manifest``); the adapter that walks the mounted medium
and hashes its files lives in ``nodeagent/adapters``. Every text taken from the medium that
reaches a message is clipped (``strict.clip``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from nodeagent.bundles.manifest import (
    ECDSA_SIGNATURE_NAME,
    MANIFEST_NAME,
    SIGNATURE_NAME,
    BundleDigestMismatch,
    BundleIncomplete,
    BundleManifest,
    BundleSizeMismatch,
    BundleUnlistedFile,
    BundleUnsafeEntry,
    ExpectedFile,
)
from nodeagent.strict import clip

METADATA_DIRS: Final = frozenset({"lost+found", "System Volume Information"})
"""Directories a filesystem or an operating system makes by itself at the root of a medium
(mkfs.ext4; Windows on FAT/exFAT). Ignored when empty; anything inside them is refused."""

EntryKind = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One entry of the medium as ``lstat`` saw it (links not followed)."""

    path: str
    kind: EntryKind
    size_bytes: int = 0


def check_tree(entries: Iterable[TreeEntry], manifest: BundleManifest) -> None:
    """Refuse a tree with unsafe, unlisted, missing or wrongly sized entries (no hashing).

    ``entries`` is consumed as it comes (a walk of the medium): the first entry that breaks
    a rule raises, so memory stays bounded by the manifest, whatever the medium holds.
    """
    expected = {f.path: f for f in manifest.files}
    allowed = set(expected) | {MANIFEST_NAME, SIGNATURE_NAME, ECDSA_SIGNATURE_NAME}
    parents = {"/".join(p.split("/")[:i]) for p in allowed for i in range(1, p.count("/") + 1)}
    seen: set[str] = set()
    for entry in entries:
        _check_entry(entry, expected, allowed, parents)
        if entry.path in expected and entry.kind == "file":  # a directory is not the file
            seen.add(entry.path)
    missing = sorted(set(expected) - seen)
    if missing:
        raise BundleIncomplete(
            f"{len(missing)} listed file(s) missing from the bundle, first {missing[0]}; "
            "the medium may be incomplete or was written partly"
        )


def _check_entry(
    entry: TreeEntry,
    expected: Mapping[str, ExpectedFile],
    allowed: set[str],
    parents: set[str],
) -> None:
    shown = clip(entry.path, 200)
    top = entry.path.split("/", 1)[0]
    if top in METADATA_DIRS and top != entry.path and top not in parents:
        raise BundleUnlistedFile(
            f"{shown} is inside {top}, which must be empty on a bundle medium (a filesystem "
            "check may have put recovered files there): make the medium again"
        )
    if entry.kind in ("symlink", "other"):
        raise BundleUnsafeEntry(
            f"{shown} is a {'symbolic link' if entry.kind == 'symlink' else 'special file'}; "
            "bundles hold only regular files and directories"
        )
    if entry.kind == "dir":
        if entry.path not in parents and entry.path not in METADATA_DIRS:
            raise BundleUnlistedFile(f"directory {shown} is not part of the bundle")
        return
    if entry.path not in allowed:
        raise BundleUnlistedFile(f"{shown} is not listed in bundle.json")
    want = expected.get(entry.path)
    if want is not None and want.size_bytes != entry.size_bytes:
        raise BundleSizeMismatch(
            f"{entry.path} is {entry.size_bytes} bytes, bundle.json says {want.size_bytes}"
        )


def check_digest(file: ExpectedFile, actual_hex: str) -> None:
    if actual_hex != file.sha256_hex:
        raise BundleDigestMismatch(
            f"{file.path} does not match its digest (sha256 {actual_hex[:12]}…, "
            f"expected {file.sha256_hex[:12]}…): the bundle is damaged or was altered"
        )
