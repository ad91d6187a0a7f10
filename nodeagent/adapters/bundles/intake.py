"""Glue between the importer's ports and the bundle adapters: checks before import, spec dirs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nodeagent.adapters.bundles.tree import (
    check_signed_bundle,
    load_trusted_keys_dir,
    read_signed,
)
from nodeagent.adapters.files import write_atomic
from nodeagent.adapters.fips import FIPS_ENABLED_FILE
from nodeagent.bundles.manifest import BundleManifest, BundleUnsafePath, check_file_name
from nodeagent.registries import Platform
from nodeagent.strict import quoted


@dataclass(frozen=True)
class CheckedBundle:
    """A bundle whose signature, references and file tree passed (blobs are hashed as served)."""

    manifest: BundleManifest
    signed_by: str
    key_id_hex: str
    manifest_digest: str
    """``sha256:<hex>`` of the ``bundle.json`` verified."""
    linked: tuple[str, ...] = ()
    """The other key that signed it (``ecdsa_signature.ManifestVerified.linked``)."""


def check_for_import(
    root: Path, trusted_keys_dir: Path, platform: Platform, *, fips_switch: Path = FIPS_ENABLED_FILE
) -> CheckedBundle:
    """Signature first, then the architecture, the tree and each image's completeness.

    Only manifests, configs and layout files are read here; layers are hashed while the
    runtime pulls them (one read of the medium), and a blob that fails is never sent whole.
    """
    manifest, verified, digest = read_signed(
        root, load_trusted_keys_dir(trusted_keys_dir, fips_switch=fips_switch)
    )
    check_signed_bundle(root, manifest, platform)
    key_id = verified.key_id_hex
    signed_by = f"{verified.key_name or key_id} ({key_id})"
    return CheckedBundle(manifest, signed_by, key_id, digest, verified.linked)


class SpecDirs:
    """``importer.SpecSink``: bundle sets go to the persistent or the transient spec directory."""

    def __init__(self, persistent_dir: Path, transient_dir: Path) -> None:
        self.persistent_dir = persistent_dir
        self.transient_dir = transient_dir

    def write_set(self, file_name: str, text: str, *, is_persistent: bool) -> Path:
        """Write ``file_name`` in the spec directory; refuse a name that would land elsewhere."""
        directory = self.persistent_dir if is_persistent else self.transient_dir
        path = directory / check_file_name(file_name)
        if path.resolve().parent != directory.resolve():
            raise BundleUnsafePath(
                f"{quoted(file_name, 200)} resolves outside the spec directory {directory}"
            )
        write_atomic(path, text.encode())
        return path
