"""The I/O of release bundles (``nodeagent.bundles.release``): layers, signature files.

- ``fetch_release``: plan and fetch a release image into the bundle's blob directory (it is
  in the bundle anyway), then read ``release-manifests/image-references`` and
  ``release-metadata`` from its layers, the topmost layer first (an upper layer's file
  hides a lower one's), each layer a gzip-compressed tar read as a stream and left as soon
  as both files are found. Bounded: at most ``MAX_LAYER_READ_BYTES`` decompressed per
  layer, each file at most ``release.MAX_RELEASE_FILE_BYTES``; nothing is extracted to
  disk, a member counts only when its normalised name is exactly one of the two paths and
  it is a regular file.
- ``read_signature_files`` / ``read_signature_dir``: the signatures ``bundle create`` carries,
  from files named on the command line or a signature store (``sha256=<hex>/signature-N``).
- ``read_release_signatures``: a bundle's signature files, each checked against the signed
  manifest's size and sha256 (rule R32), for the ConfigMap.
"""

from __future__ import annotations

import asyncio
import gzip
import tarfile
import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from nodeagent.adapters.bundles.fetcher import ImageFetcher, PlannedImage
from nodeagent.adapters.bundles.tree import (
    BundleDir,
    load_trusted_keys_dir,
    read_signed_manifest,
    release_signatures,
)
from nodeagent.adapters.fips import FIPS_ENABLED_FILE
from nodeagent.bundles import release
from nodeagent.bundles.manifest import BundleManifest
from nodeagent.cluster.kinds import CONFIG_MAP, ResourceKind
from nodeagent.errors import ApiRequestRejected, ReleaseImageInvalid
from nodeagent.references import PinnedImageRef
from nodeagent.registries import Platform
from nodeagent.strict import clip

MAX_LAYER_READ_BYTES: Final = 2 * 1024 * 1024 * 1024
"""Decompressed bytes read from one layer looking for the release files (a real release
image's manifests layer is a few MiB; a gzip bomb stops here)."""
_GZIP_MAGIC: Final = b"\x1f\x8b"


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    """``bundle create --release``: the release image, its set's name, its signatures."""

    ref: PinnedImageRef
    set_name: str | None = None
    signatures: tuple[bytes, ...] = ()
    """In index order: the first is ``sha256-<hex>-1``."""
    from_version: str = ""
    """``--from-version``: the cluster version the release must upgrade (``""``: not checked)."""


class _Reads(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class _Bounded:
    """A read-only stream that refuses to give more than ``limit`` bytes."""

    def __init__(self, stream: _Reads, limit: int, what: str) -> None:
        self.stream, self.left, self.what = stream, limit, what

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size if size >= 0 else self.left + 1)
        self.left -= len(data)
        if self.left < 0:
            raise ReleaseImageInvalid(
                f"{self.what} decompresses to more than {MAX_LAYER_READ_BYTES} bytes before "
                "the release files; refusing it"
            )
        return data


def read_layer_files(path: Path, wanted: Collection[str], what: str) -> dict[str, bytes]:
    """The regular files among ``wanted`` in the layer at ``path`` (tar, optionally gzip)."""
    found: dict[str, bytes] = {}
    try:
        with path.open("rb") as raw:
            is_gzip = raw.read(2) == _GZIP_MAGIC
            raw.seek(0)
            stream: _Reads = gzip.GzipFile(fileobj=raw) if is_gzip else raw
            bounded = _Bounded(stream, MAX_LAYER_READ_BYTES, what)
            with tarfile.open(fileobj=bounded, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    name = release.layer_member_name(member.name)
                    if name not in wanted or name in found or not member.isreg():
                        continue
                    found[name] = _member_bytes(tar, member, name)
                    if len(found) == len(wanted):
                        break
    except (OSError, EOFError, tarfile.TarError, zlib.error) as err:
        raise ReleaseImageInvalid(f"{what} is not a readable tar layer: {clip(err, 200)}") from err
    return found


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> bytes:
    if member.size > release.MAX_RELEASE_FILE_BYTES:
        raise ReleaseImageInvalid(
            f"the release image's {name} is {member.size} bytes, more than "
            f"{release.MAX_RELEASE_FILE_BYTES}"
        )
    source = tar.extractfile(member)
    if source is None:
        raise ReleaseImageInvalid(f"the release image's {name} cannot be read")
    return source.read(release.MAX_RELEASE_FILE_BYTES + 1)


def read_release_files(layer_paths: Sequence[Path], ref: PinnedImageRef) -> dict[str, bytes]:
    """Both release files from the layers (bottom first as a manifest lists them)."""
    found: dict[str, bytes] = {}
    for index, path in reversed(list(enumerate(layer_paths))):
        wanted = [p for p in release.RELEASE_FILES if p not in found]
        found |= read_layer_files(path, wanted, f"{ref} layer {index + 1}")
        if len(found) == len(release.RELEASE_FILES):
            break
    return found


async def fetch_release(
    fetcher: ImageFetcher, ref: PinnedImageRef, platform: Platform
) -> tuple[PlannedImage, release.ReleasePayload]:
    """The release image (for ``platform`` when it is an index) and what it says."""
    planned = await fetcher.plan(ref, platform)
    for layer in planned.layers:
        await fetcher.fetch(ref, layer, is_manifest=False)
    paths = [fetcher.blobs_dir / b.digest.removeprefix("sha256:") for b in planned.layers]
    files = await asyncio.to_thread(read_release_files, paths, ref)
    return planned, release.parse_release_files(files)


# ---------------------------------------------------------------- signatures to carry
def _read_signature(path: Path) -> bytes:
    try:
        with path.open("rb") as stream:
            data = stream.read(release.MAX_SIGNATURE_BYTES + 1)
    except OSError as err:
        raise ReleaseImageInvalid(f"cannot read signature {path}: {err.strerror}") from err
    if not data or len(data) > release.MAX_SIGNATURE_BYTES:
        raise ReleaseImageInvalid(
            f"signature {path} is empty or larger than {release.MAX_SIGNATURE_BYTES} bytes"
        )
    return data


def read_signature_files(paths: Sequence[Path], digest: str) -> tuple[bytes, ...]:
    """``--release-signature FILE``...: signatures of ``digest``, numbered in this order."""
    release.check_signature_count(len(paths), digest)
    return tuple(_read_signature(path) for path in paths)


def read_signature_dir(directory: Path, digest: str) -> tuple[bytes, ...]:
    """``--signature-dir``: ``<dir>/sha256=<hex>/signature-<n>`` for ``digest``, n = 1, 2, …"""
    found: dict[int, Path] = {}
    own = directory / digest.replace(":", "=")
    try:
        entries = sorted(own.iterdir()) if own.is_dir() else []
    except OSError as err:
        raise ReleaseImageInvalid(f"cannot list {own}: {err.strerror}") from err
    for path in entries:
        index = release.store_signature_index(own.name, path.name, digest)
        if index is not None and path.is_file() and not path.is_symlink():
            found[index] = path
    numbers = sorted(found)
    if numbers != list(range(1, len(numbers) + 1)):
        raise ReleaseImageInvalid(
            f"{own}: signatures must be signature-1, signature-2, … without a gap"
        )
    release.check_signature_count(len(numbers), digest)
    return tuple(_read_signature(found[n]) for n in numbers)


# ---------------------------------------------------------------- signatures carried
def read_release_signatures(root: Path, manifest: BundleManifest) -> dict[str, bytes]:
    with BundleDir(root) as directory:
        return release_signatures(directory, manifest)


# ---------------------------------------------------------------- the ConfigMap, on the node
class StoredSignatures:
    """``bundles.release_signatures.SignatureSource``: a bundle's directory in the node
    store (or any bundle directory), its signature checked against the trusted keys."""

    def __init__(
        self, store_dir: Path, trusted_keys_dir: Path, *, fips_switch: Path = FIPS_ENABLED_FILE
    ) -> None:
        self.store_dir, self.trusted_keys_dir = store_dir, trusted_keys_dir
        self.fips_switch = fips_switch

    def config_map(self, bundle_id: str) -> dict[str, Any]:
        root = self.store_dir / "bundles" / bundle_id
        return config_map_at(root, self.trusted_keys_dir, fips_switch=self.fips_switch)


def config_map_at(
    root: Path, trusted_keys_dir: Path, *, fips_switch: Path = FIPS_ENABLED_FILE
) -> dict[str, Any]:
    """The signature ConfigMap of the bundle at ``root``, every byte checked first."""
    keys = load_trusted_keys_dir(trusted_keys_dir, fips_switch=fips_switch)
    manifest, _ = read_signed_manifest(root, keys)
    if manifest.release is None or not manifest.release.signatures:
        raise ReleaseImageInvalid(
            f"bundle {manifest.bundle_id} carries no release signatures (made without "
            "bundle create --release and --release-signature or --signature-dir)"
        )
    contents = read_release_signatures(root, manifest)
    return release.signature_config_map(manifest.release, contents, bundle_id=manifest.bundle_id)


class _Writes(Protocol):
    async def create(self, kind: ResourceKind, body: dict[str, Any]) -> dict[str, Any]: ...

    async def merge_patch(
        self, kind: ResourceKind, name: str, patch: dict[str, Any], namespace: str | None = None
    ) -> dict[str, Any]: ...


class ConfigMaps:
    """``bundles.release_signatures.ConfigMapApplier`` over ``adapters.kube.KubeApi``.

    Creates the ConfigMap, or, when another node made it first (409), adds this bundle's keys
    to it with a JSON merge patch: never a key removed, so a node with fewer signatures of the
    release leaves the others' (a server-side apply by the one field manager ``nodeagent``
    would remove them). A key another node wrote with other bytes is refused by the
    admission policy of deploy/opt-in/release-signatures.yaml (decision 0051).
    """

    def __init__(self, api: _Writes) -> None:
        self.api = api

    async def apply_config_map(self, body: dict[str, Any]) -> None:
        try:
            await self.api.create(CONFIG_MAP, body)
        except ApiRequestRejected as exc:
            if "HTTP 409" not in exc.message:
                raise
            metadata = body["metadata"]
            patch = release.signature_additions(body)
            await self.api.merge_patch(CONFIG_MAP, metadata["name"], patch, metadata["namespace"])
