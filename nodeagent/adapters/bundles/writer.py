"""Make an upgrade bundle: images fetched by digest, laid out as OCI, described and signed.

``create_bundle`` works in four steps (the format is docs/bundle-format.md):

1. ``resolve_refs``: the ``--image`` references (digest references only) and every image
   the PinnedImageSets name, each once;
2. plan: each image's manifest, for a multi-arch index also the one child for the
   bundle's platform, and its config go into ``blobs/sha256/``; a config of another
   platform is refused; free space on the output is checked;
3. the layers, each blob once, streamed from the registry through sha256 into a
   temporary file, fsynced and renamed into place. A blob an interrupted earlier run left
   behind is kept when it hashes right;
4. ``oci-layout`` and ``index.json``; the tree checked as ``bundle verify`` will check it;
   then ``bundle.json.minisig`` and, last, ``bundle.json``. A directory without
   ``bundle.json`` is not a bundle, so an interrupted create never leaves a signed but
   incomplete one.

Blobs are fetched one at a time: ``progress`` is called from the fetching thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final, Protocol

from nodeagent.adapters.bundles import tree as bundle_media
from nodeagent.adapters.files import write_atomic
from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.adapters.registry.transport import MAX_MANIFEST_BYTES
from nodeagent.authfile import AuthStore
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles import minisign
from nodeagent.errors import (
    HostFileError,
    ImageNotFound,
    ImageReferenceInvalid,
    InsufficientDiskSpace,
    SpecInvalid,
)
from nodeagent.references import ImageRef, parse_image_ref
from nodeagent.registries import (
    MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST,
    ManifestIndex,
    Platform,
    parse_manifest,
    select_platform,
)
from nodeagent.specs import API_VERSION, KIND, PinnedImageSet
from nodeagent.units import format_bytes

OCI_LAYOUT_BYTES: Final = b'{"imageLayoutVersion": "1.0.0"}'
REF_NAME_ANNOTATION: Final = "org.opencontainers.image.ref.name"
IMAGE_CONFIG_TYPES: Final = frozenset(
    {"application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"}
)
_DIGEST: Final = re.compile(r"sha256:[a-f0-9]{64}")
_BUNDLE_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")  # bundle.parse_manifest's rule


class Progress(Protocol):
    def __call__(
        self, blobs_done: int, blobs_total: int, bytes_done: int, bytes_total: int
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Descriptor:
    media_type: str
    digest: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class PlannedImage:
    """One image of the bundle: the manifest its digest names and every blob it needs."""

    ref: ImageRef
    manifests: tuple[Descriptor, ...]
    """What ``ref.digest`` names (an image manifest or an index), then the index's child."""
    config: Descriptor
    layers: tuple[Descriptor, ...]

    @property
    def manifest(self) -> Descriptor:
        return self.manifests[0]

    @property
    def blobs(self) -> tuple[Descriptor, ...]:
        """Every blob of the image, each digest once."""
        unique = {b.digest: b for b in (*self.manifests, self.config, *self.layers)}
        return tuple(unique.values())

    @property
    def size_bytes(self) -> int:
        return sum(blob.size_bytes for blob in self.blobs)


@dataclass(frozen=True, slots=True)
class CreatedBundle:
    bundle_id: str
    path: Path
    images: tuple[PlannedImage, ...]
    blob_count: int
    size_bytes: int
    """Every blob and layout file: what ``bundle verify`` hashes."""
    key_id_hex: str
    trusted_comment: str


# ---------------------------------------------------------------- pure helpers
def resolve_refs(image_texts: Iterable[str], sets: Iterable[PinnedImageSet]) -> list[ImageRef]:
    """The ``--image`` references, then the sets' images, each once; tags are refused."""
    refs: dict[str, ImageRef] = {}
    for text in image_texts:
        try:
            ref = parse_image_ref(text.strip())
        except ImageReferenceInvalid as err:
            raise ImageReferenceInvalid(
                f"--image {err.message}; a bundle names images by digest: resolve a tag with "
                "`skopeo inspect --format '{{.Digest}}' docker://NAME:TAG`"
            ) from None
        refs.setdefault(str(ref), ref)
    for image_set in sets:
        for ref in image_set.images:
            refs.setdefault(str(ref), ref)
    if not refs:
        raise SpecInvalid("a bundle needs at least one --image or --pinned-image-set")
    return list(refs.values())


def check_bundle_id(bundle_id: str) -> str:
    if not _BUNDLE_ID.fullmatch(bundle_id):
        raise SpecInvalid(f"bundle id {bundle_id!r} must be 1-128 of A-Z a-z 0-9 . _ -")
    return bundle_id


def default_bundle_id(architecture: str, refs: Iterable[ImageRef], sets_json: Any) -> str:
    """Derived from the content: the same images and sets give the same id (import is a no-op)."""
    content = json.dumps([architecture, sorted(map(str, refs)), sets_json], sort_keys=True)
    return f"bundle-{architecture}-{hashlib.sha256(content.encode()).hexdigest()[:16]}"


def set_object(image_set: PinnedImageSet) -> dict[str, Any]:
    """A validated set in the OpenShift shape, as ``bundle.json`` carries it."""
    metadata: dict[str, Any] = {"name": image_set.name}
    if image_set.labels:
        metadata["labels"] = dict(image_set.labels)
    images = [{"name": str(ref)} for ref in image_set.images]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"pinnedImages": images},
    }


def _descriptor(item: Any, ref: ImageRef) -> Descriptor:
    is_ok = isinstance(item, dict) and isinstance(item.get("size"), int) and item["size"] >= 0
    digest = item.get("digest") if isinstance(item, dict) else None
    if not is_ok or not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ImageNotFound(f"{ref}: its manifest has a descriptor bundles cannot hold: {item!r}")
    return Descriptor(str(item.get("mediaType", "")), digest, item["size"])


def image_blobs(body: bytes, ref: ImageRef) -> tuple[Descriptor, ...]:
    """Config and layers of an image manifest body (already parsed once: it is JSON)."""
    doc = json.loads(body)
    return (_descriptor(doc["config"], ref), *(_descriptor(i, ref) for i in doc["layers"]))


def top_descriptor(digest: str, body: bytes, ref: ImageRef) -> Descriptor:
    """The descriptor of a fetched manifest: its own ``mediaType``, else OCI's for its shape."""
    parsed = parse_manifest(body, "", ref=str(ref))
    is_index = isinstance(parsed, ManifestIndex)
    fallback = MEDIA_TYPE_OCI_INDEX if is_index else MEDIA_TYPE_OCI_MANIFEST
    return Descriptor(str(json.loads(body).get("mediaType") or fallback), digest, len(body))


def index_child(body: bytes, platform: Platform, ref: ImageRef) -> Descriptor | None:
    """For an index body, the entry for ``platform`` (the runtime picks the same); else None."""
    parsed = parse_manifest(body, "", ref=str(ref))
    if not isinstance(parsed, ManifestIndex):
        return None
    digest = select_platform(parsed, platform, ref=str(ref))
    entries = [_descriptor(item, ref) for item in json.loads(body)["manifests"]]
    return next(entry for entry in entries if entry.digest == digest)


def index_doc(images: Sequence[PlannedImage]) -> bytes:
    """The layout's ``index.json``: each image's manifest, named by its full reference."""
    manifests = [
        {
            "mediaType": image.manifest.media_type,
            "digest": image.manifest.digest,
            "size": image.manifest.size_bytes,
            "annotations": {REF_NAME_ANNOTATION: str(image.ref)},
        }
        for image in images
    ]
    doc = {"schemaVersion": 2, "mediaType": MEDIA_TYPE_OCI_INDEX, "manifests": manifests}
    return json.dumps(doc, indent=2).encode() + b"\n"


def manifest_doc(
    *,
    bundle_id: str,
    created: str,
    architecture: str,
    images: Sequence[PlannedImage],
    files: dict[str, bytes],
    sets: Sequence[PinnedImageSet],
) -> bytes:
    """``bundle.json`` (format 1): images, every blob once, layout files, PinnedImageSets."""
    blobs = {blob.digest: blob.size_bytes for image in images for blob in image.blobs}
    doc = {
        "formatVersion": bundle.FORMAT_VERSION,
        "bundleId": bundle_id,
        "created": created,
        "architecture": architecture,
        "layout": "oci",
        "images": [
            {"name": str(i.ref), "manifestDigest": i.ref.digest, "sizeBytes": i.size_bytes}
            for i in images
        ],
        "blobs": [{"digest": d, "sizeBytes": size} for d, size in sorted(blobs.items())],
        "files": [
            {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "sizeBytes": len(data)}
            for path, data in sorted(files.items())
        ],
        "pinnedImageSets": [{"persistent": s.is_persistent, "object": set_object(s)} for s in sets],
    }
    return json.dumps(doc, indent=2).encode() + b"\n"


# ---------------------------------------------------------------- the output directory
_RESUMABLE: Final = frozenset({"blobs", "oci-layout", "index.json", bundle.SIGNATURE_NAME})


def prepare_output(output_dir: Path) -> Path:
    """Make ``output_dir`` ready: empty, or left by an interrupted create; return its blob dir."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        names = {path.name for path in output_dir.iterdir()}
    except OSError as err:
        raise HostFileError(f"cannot create or list {output_dir}: {err.strerror}") from err
    if bundle.MANIFEST_NAME in names:
        raise HostFileError(f"{output_dir} already holds a bundle; give an empty directory")
    others = sorted(n for n in names - _RESUMABLE if not n.endswith(".tmp"))
    if "lost+found" in others:
        raise HostFileError(
            f"{output_dir} holds lost+found, which bundle verify refuses as unlisted: "
            f"remove it (rmdir {output_dir / 'lost+found'}) and run again"
        )
    if others:
        raise HostFileError(f"{output_dir} is not empty (it holds {others[0]}); give an empty one")
    (output_dir / bundle.SIGNATURE_NAME).unlink(missing_ok=True)  # an interrupted run's
    blobs_dir = output_dir / "blobs" / "sha256"
    blobs_dir.mkdir(parents=True, exist_ok=True)
    return blobs_dir


def _is_present(path: Path, blob: Descriptor | str) -> bool:
    """Whether ``path`` holds ``blob`` already (an interrupted run fetched it)."""
    digest = blob if isinstance(blob, str) else blob.digest
    try:
        if not isinstance(blob, str) and path.stat().st_size != blob.size_bytes:
            return False
        with path.open("rb") as stream:
            return "sha256:" + hashlib.file_digest(stream, "sha256").hexdigest() == digest
    except FileNotFoundError:
        return False


def _commit(stream: IO[bytes], tmp: Path, final: Path) -> None:
    stream.flush()
    os.fsync(stream.fileno())
    stream.close()
    tmp.replace(final)


def _remove_unlisted(blobs_dir: Path, keep: set[str]) -> None:
    for entry in os.scandir(blobs_dir):
        if entry.name not in keep and entry.is_file(follow_symlinks=False):
            (blobs_dir / entry.name).unlink()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free_bytes(directory: Path) -> int:
    figures = os.statvfs(directory)
    return figures.f_bavail * figures.f_frsize


# ---------------------------------------------------------------- fetching
class _Fetcher:
    """Fetches blobs of images into ``blobs_dir``, one at a time, counting progress."""

    def __init__(
        self, client: RegistryClient, auth: AuthStore, blobs_dir: Path, progress: Progress | None
    ) -> None:
        self.client, self.auth, self.blobs_dir, self.progress = client, auth, blobs_dir, progress
        self.blobs_done = self.blobs_total = self.bytes_done = self.bytes_total = 0

    async def fetch(self, ref: ImageRef, blob: Descriptor | str, *, is_manifest: bool) -> None:
        """Fetch one blob (a bare digest: a manifest of unknown size), unless it is there."""
        digest = blob if isinstance(blob, str) else blob.digest
        final = self.blobs_dir / digest.removeprefix("sha256:")
        if not await asyncio.to_thread(_is_present, final, blob):
            await self._download(ref, digest, blob, final, is_manifest=is_manifest)
        self.blobs_done += 1
        self._report(0)

    async def _download(
        self, ref: ImageRef, digest: str, blob: Descriptor | str, final: Path, *, is_manifest: bool
    ) -> None:
        max_bytes = MAX_MANIFEST_BYTES if isinstance(blob, str) else blob.size_bytes
        tmp = final.with_name(f".{final.name}.partial.tmp")
        stream = await asyncio.to_thread(tmp.open, "wb")
        try:
            credentials = self.auth.credentials_for(str(ref))
            await self.client.fetch_to(
                str(ref), digest, stream, credentials,
                max_bytes=max_bytes, is_manifest=is_manifest, on_bytes=self._report,
            )  # fmt: skip
            await asyncio.to_thread(_commit, stream, tmp, final)
        finally:
            stream.close()
            tmp.unlink(missing_ok=True)

    def _report(self, count_bytes: int) -> None:
        self.bytes_done += count_bytes
        if self.progress is not None and self.blobs_total:
            self.progress(self.blobs_done, self.blobs_total, self.bytes_done, self.bytes_total)

    async def plan(self, ref: ImageRef, platform: Platform) -> PlannedImage:
        """Fetch ``ref``'s manifest(s) and config; check the config's platform."""
        await self.fetch(ref, ref.digest, is_manifest=True)
        body = await asyncio.to_thread(self._read, ref.digest)
        top = top_descriptor(ref.digest, body, ref)
        manifests = [top]
        child = index_child(body, platform, ref)
        if child is not None:
            await self.fetch(ref, child, is_manifest=True)
            body = await asyncio.to_thread(self._read, child.digest)
            manifests.append(child)
        config, *layers = image_blobs(body, ref)
        await self.fetch(ref, config, is_manifest=False)
        if config.media_type in IMAGE_CONFIG_TYPES:
            _check_platform(await asyncio.to_thread(self._read, config.digest), platform, ref)
        return PlannedImage(ref, tuple(manifests), config, tuple(layers))

    def _read(self, digest: str) -> bytes:
        return (self.blobs_dir / digest.removeprefix("sha256:")).read_bytes()


def _check_platform(config_body: bytes, platform: Platform, ref: ImageRef) -> None:
    try:
        doc = json.loads(config_body)
        found = (str(doc.get("os", "")), str(doc.get("architecture", "")))
    except (ValueError, AttributeError):
        raise ImageNotFound(f"{ref}: its image config is not a JSON object") from None
    if found != (platform.os, platform.architecture):
        raise ImageNotFound(
            f"{ref} is a {found[0]}/{found[1]} image and the bundle is for {platform}: give the "
            f"digest of its {platform} image, or make the bundle with --arch {found[1]}"
        )


# ---------------------------------------------------------------- the whole bundle
async def create_bundle(
    refs: Sequence[ImageRef],
    sets: Sequence[PinnedImageSet],
    secret_key: minisign.SecretKey,
    output_dir: Path,
    *,
    client: RegistryClient,
    auth: AuthStore,
    bundle_id: str | None = None,
    progress: Progress | None = None,
    now: datetime | None = None,
) -> CreatedBundle:
    """Fetch ``refs`` for ``client.platform`` into ``output_dir`` and sign the bundle."""
    platform = client.platform
    sets_json = [set_object(s) for s in sets]
    bundle_id = check_bundle_id(
        bundle_id or default_bundle_id(platform.architecture, refs, sets_json)
    )
    blobs_dir = await asyncio.to_thread(prepare_output, output_dir)
    fetcher = _Fetcher(client, auth, blobs_dir, progress)
    images = [await fetcher.plan(ref, platform) for ref in refs]
    await _fetch_layers(fetcher, images, output_dir)
    created = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = manifest_doc(
        bundle_id=bundle_id, created=created, architecture=platform.architecture,
        images=images, files=_layout_files(images), sets=sets,
    )  # fmt: skip
    comment = f"nodeagent bundle {bundle_id} created {created}"
    await asyncio.to_thread(_finish, output_dir, images, doc, secret_key, comment)
    size_bytes = bundle.parse_manifest(doc).total_size_bytes
    blob_count = len({b.digest for image in images for b in image.blobs})
    key_id = secret_key.public_key().key_id_hex
    return CreatedBundle(
        bundle_id, output_dir, tuple(images), blob_count, size_bytes, key_id, comment
    )


async def _fetch_layers(
    fetcher: _Fetcher, images: Sequence[PlannedImage], output_dir: Path
) -> None:
    """Every layer not fetched yet, after checking that they fit on the output."""
    fetched = {b.digest: b for i in images for b in (*i.manifests, i.config)}
    todo = {b.digest: (i.ref, b) for i in images for b in i.layers if b.digest not in fetched}
    needed_bytes = sum(b.size_bytes for _, b in todo.values())
    free_bytes = await asyncio.to_thread(_free_bytes, output_dir)
    if needed_bytes > free_bytes:
        raise InsufficientDiskSpace(
            f"{output_dir} has {format_bytes(free_bytes)} free and the layers need up to "
            f"{format_bytes(needed_bytes)}: use a larger medium, or fewer images"
        )
    fetcher.blobs_done, fetcher.blobs_total = len(fetched), len(fetched) + len(todo)
    fetcher.bytes_done = sum(b.size_bytes for b in fetched.values())
    fetcher.bytes_total = fetcher.bytes_done + needed_bytes
    for ref, blob in todo.values():
        await fetcher.fetch(ref, blob, is_manifest=False)


def _layout_files(images: Sequence[PlannedImage]) -> dict[str, bytes]:
    return {"oci-layout": OCI_LAYOUT_BYTES, "index.json": index_doc(images)}


def _finish(
    output_dir: Path,
    images: Sequence[PlannedImage],
    doc: bytes,
    secret_key: minisign.SecretKey,
    comment: str,
) -> None:
    """Layout files, a check of the tree as the verifier sees it, the signature, bundle.json."""
    blobs_dir = output_dir / "blobs" / "sha256"
    _remove_unlisted(blobs_dir, {b.digest.removeprefix("sha256:") for i in images for b in i.blobs})
    _fsync_dir(blobs_dir)
    for name, data in _layout_files(images).items():
        write_atomic(output_dir / name, data)
    manifest = bundle.parse_manifest(doc)
    bundle_media.check_references(manifest)
    bundle.check_tree(bundle_media.walk_tree(output_dir), manifest)
    signature = minisign.sign(doc, secret_key, trusted_comment=comment)
    write_atomic(output_dir / bundle.SIGNATURE_NAME, signature.encode())
    write_atomic(output_dir / bundle.MANIFEST_NAME, doc)  # last: now it is a bundle
