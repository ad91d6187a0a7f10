"""Glue between the importer's ports and the bundle adapters: checks before import, spec dirs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nodeagent.adapters.bundles.tree import (
    check_references,
    load_trusted_keys_dir,
    read_signed_manifest,
    walk_tree,
)
from nodeagent.adapters.files import write_atomic
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles.manifest import BundleManifest


@dataclass(frozen=True)
class CheckedBundle:
    """A bundle whose signature, references and file tree passed (blobs are hashed as served)."""

    manifest: BundleManifest
    signed_by: str


def check_for_import(root: Path, trusted_keys_dir: Path) -> CheckedBundle:
    """Signature first, then the manifest's references and the tree; no blob is read here.

    Blobs are hashed while the runtime pulls them (one read of the medium), and
    a blob that fails is never sent whole.
    """
    manifest, verified = read_signed_manifest(root, load_trusted_keys_dir(trusted_keys_dir))
    check_references(manifest)
    bundle.check_tree(walk_tree(root), manifest)
    signer = verified.key_name or verified.key_id_hex
    return CheckedBundle(manifest, f"{signer} ({verified.key_id_hex})")


class SpecDirs:
    """``importer.SpecSink``: bundle sets go to the persistent or the transient spec directory."""

    def __init__(self, persistent_dir: Path, transient_dir: Path) -> None:
        self.persistent_dir = persistent_dir
        self.transient_dir = transient_dir

    def write_set(self, file_name: str, text: str, *, is_persistent: bool) -> Path:
        directory = self.persistent_dir if is_persistent else self.transient_dir
        path = directory / file_name
        write_atomic(path, text.encode())
        return path
