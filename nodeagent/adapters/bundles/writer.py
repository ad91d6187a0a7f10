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

Steps 2 and 3 talk to the registry: ``nodeagent.adapters.bundles.fetcher``. Blobs are
fetched one at a time: ``progress`` is called from the fetching thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from nodeagent.adapters.bundles import tree as bundle_media
from nodeagent.adapters.bundles.fetcher import ImageFetcher, PlannedImage, Progress
from nodeagent.adapters.bundles.release import ReleaseRequest, fetch_release
from nodeagent.adapters.bundles.sigstore import CarriedSignature, fetch_signature
from nodeagent.adapters.files import write_atomic
from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.authfile import AuthStore
from nodeagent.bundles import ecdsa_signature, minisign
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles import release as releases
from nodeagent.bundles.agent_image import AGENT_IMAGE_KEY, agent_image_doc
from nodeagent.bundles.freshness import Freshness
from nodeagent.bundles.signatures import SIGNATURES_KEY, signatures_doc
from nodeagent.bundles.tags import TAGS_KEY, ServedTag, image_option, tags_doc
from nodeagent.bundles.target import FRESHNESS_FORMAT_VERSION, BundleTarget, target_doc
from nodeagent.bundles.tree_rules import METADATA_DIRS
from nodeagent.errors import HostFileError, KeyMalformed, ReleaseNotAnUpgrade, SpecInvalid
from nodeagent.references import PinnedImageRef
from nodeagent.registries import MEDIA_TYPE_OCI_INDEX, Platform
from nodeagent.specs import PinnedImageSet
from nodeagent.strict import clip
from nodeagent.versions import check_upgrade_path

OCI_LAYOUT_BYTES: Final = b'{"imageLayoutVersion": "1.0.0"}'
REF_NAME_ANNOTATION: Final = "org.opencontainers.image.ref.name"
_BUNDLE_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")  # bundle.parse_manifest's rule


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
    target: BundleTarget | None = None
    release: releases.BundleRelease | None = None
    payload_count: int = 0
    """The release's payload images (``image-references``), when there is a release."""
    signatures: tuple[CarriedSignature, ...] = ()
    """The images' sigstore signatures carried (``--with-signatures``)."""
    served_tags: tuple[ServedTag, ...] = ()
    """The tags the bundle serves (``--serve-tags``)."""


# ---------------------------------------------------------------- pure helpers
def resolve_refs(
    image_texts: Iterable[str], sets: Iterable[PinnedImageSet], *, is_serving_tags: bool = False
) -> list[PinnedImageRef]:
    """The ``--image`` references, then the sets' images, each once; tags are refused, but
    with ``--serve-tags`` (``is_serving_tags``) an image may be given as
    ``host/repo:tag@sha256:…`` (``tags.served_tags_of_images`` reads its tag)."""
    refs: dict[str, PinnedImageRef] = {}
    for text in image_texts:
        ref, _ = image_option(text, is_serving_tags=is_serving_tags)
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


def default_bundle_id(
    architecture: str,
    refs: Iterable[PinnedImageRef],
    sets_json: Any,
    target: BundleTarget | None = None,
) -> str:
    """Derived from the content: the same images and sets give the same id (import is a no-op).

    The target counts too (when there is one, so ids of bundles without one stay as they
    were): the same images for two groups of nodes are two bundles, not one id with two
    different signed manifests, which a site reports as a conflict.
    """
    parts: list[Any] = [architecture, sorted(map(str, refs)), sets_json]
    if target is not None:
        parts.append(target_doc(target))
    content = json.dumps(parts, sort_keys=True)
    return f"bundle-{architecture}-{hashlib.sha256(content.encode()).hexdigest()[:16]}"


def set_object(image_set: PinnedImageSet) -> dict[str, Any]:
    """A validated set in the OpenShift shape, as ``bundle.json`` carries it."""
    return bundle.set_object(image_set)


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
    target: BundleTarget | None = None,
    freshness: Freshness | None = None,
    release: releases.BundleRelease | None = None,
    signatures: Sequence[CarriedSignature] = (),
    served_tags: Sequence[ServedTag] = (),
    agent_image: Mapping[str, str] | None = None,
) -> bytes:
    """``bundle.json``: images, every blob once, layout files, PinnedImageSets; format 3 with
    a ``freshness`` (channel, sequence, expiry: what ``bundle create`` writes) and optionally
    a ``release`` (``bundles.release``) and ``imageSignatures`` (the blobs of each signature
    listed with the others), else format 1, or 2 with a ``target`` (a reader of an older
    format refuses a newer one)."""
    if (release is not None or signatures or served_tags or agent_image) and freshness is None:
        raise ValueError("a release, signatures or tags are format 3, which needs a sequence")
    blobs = {blob.digest: blob.size_bytes for image in images for blob in image.blobs}
    blobs |= {blob.digest: blob.size_bytes for s in signatures for blob in s.blobs}
    version = bundle.FORMAT_VERSION if target is None else bundle.TARGET_FORMAT_VERSION
    doc: dict[str, Any] = {
        "formatVersion": version if freshness is None else FRESHNESS_FORMAT_VERSION,
        "bundleId": bundle_id,
        "created": created,
        "architecture": architecture,
    }
    if freshness is not None:
        doc |= {"channel": freshness.channel, "sequence": freshness.sequence}
        doc |= {"expires": freshness.expires} if freshness.expires is not None else {}
        doc |= {"supersedes": list(freshness.supersedes)} if freshness.supersedes else {}
    if target is not None:
        doc["target"] = target_doc(target)
    doc |= {
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
    if release is not None:
        doc["release"] = releases.release_doc(release)
    if signatures:
        doc[SIGNATURES_KEY] = signatures_doc(s.signature for s in signatures)
    if served_tags:
        doc[TAGS_KEY] = tags_doc(served_tags)
    if agent_image:
        doc[AGENT_IMAGE_KEY] = dict(agent_image)
    return json.dumps(doc, indent=2).encode() + b"\n"


# ---------------------------------------------------------------- the output directory
_RESUMABLE: Final = frozenset(
    {
        "blobs", "oci-layout", "index.json", bundle.SIGNATURE_NAME, bundle.ECDSA_SIGNATURE_NAME,
        releases.SIGNATURES_DIR,
    }
)  # fmt: skip


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
    for name in METADATA_DIRS.intersection(others):
        if _holds_anything(output_dir / name):
            raise HostFileError(
                f"{output_dir / name} is not empty, and bundle verify refuses anything in it: "
                "empty it, or give another directory"
            )
        others.remove(name)  # an empty one is ignored (every ext4 medium has lost+found)
    if others:
        raise HostFileError(f"{output_dir} is not empty (it holds {others[0]}); give an empty one")
    for name in (bundle.SIGNATURE_NAME, bundle.ECDSA_SIGNATURE_NAME):  # an interrupted run's
        (output_dir / name).unlink(missing_ok=True)
    blobs_dir = output_dir / "blobs" / "sha256"
    blobs_dir.mkdir(parents=True, exist_ok=True)
    return blobs_dir


def _holds_anything(directory: Path) -> bool:
    if not directory.is_dir() or directory.is_symlink():
        return True
    with os.scandir(directory) as listing:
        return any(True for _ in listing)


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


# ---------------------------------------------------------------- the whole bundle
async def create_bundle(
    refs: Sequence[PinnedImageRef],
    sets: Sequence[PinnedImageSet],
    secret_key: minisign.SecretKey | None,
    output_dir: Path,
    *,
    client: RegistryClient,
    auth: AuthStore,
    bundle_id: str | None = None,
    target: BundleTarget | None = None,
    progress: Progress | None = None,
    now: datetime | None = None,
    release: ReleaseRequest | None = None,
    freshness: Freshness | None = None,
    with_signatures: bool = False,
    served_tags: Sequence[ServedTag] = (),
    agent_statement: tuple[bytes, bytes] | None = None,
    ecdsa_key: bytes | None = None,
) -> CreatedBundle:
    """Fetch ``refs`` for ``client.platform`` into ``output_dir`` and sign the bundle.

    Every image is resolved for that platform (an index to its child, a single-platform
    image checked by its config), so the bundle's ``architecture``, the architecture half
    of its target, is what its images are. With a ``release``, the release image is read
    first and its payload images and set are added to ``refs`` and ``sets``.
    ``served_tags`` (``--serve-tags``): tags of images in ``refs``, signed in ``servedTags``.
    ``agent_statement`` (``--agent-image-statement``): (statement, raw signature) of the
    nodeagent image among ``refs``, carried in ``agentImage`` (``bundles.agent_image``).
    ``ecdsa_key`` (``--ecdsa-key``): an EC P-256/P-384 private key (PEM) that signs the
    manifest too, or instead of ``secret_key`` (``bundle.json.ecdsa-sig``, decision 0075).
    """
    key_id = signing_key_id(secret_key, ecdsa_key)  # a bad key fails before any fetch
    platform = client.platform
    blobs_dir = await asyncio.to_thread(prepare_output, output_dir)
    fetcher = ImageFetcher(client, auth, blobs_dir, progress)
    planned = await plan_bundle(
        fetcher, refs, sets, bundle_id=bundle_id, target=target, release=release
    )
    bundle_id, images, sets = planned.bundle_id, list(planned.images), planned.sets
    carried, payload_count, extra = planned.release, planned.payload_count, planned.extra
    agent_image = agent_image_doc(*agent_statement, refs) if agent_statement is not None else None
    await fetcher.fetch_layers(images, output_dir)
    signatures = [await fetch_signature(fetcher, i) for i in images] if with_signatures else []
    carried_signatures = tuple(s for s in signatures if s is not None)
    when = now or datetime.now(UTC)
    created = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    freshness = freshness or Freshness(bundle.DEFAULT_CHANNEL, int(when.timestamp()), None)
    doc = manifest_doc(
        bundle_id=bundle_id, created=created, architecture=platform.architecture,
        images=images, files=layout_files(images) | extra, sets=sets, target=target,
        freshness=freshness, release=carried, signatures=carried_signatures,
        served_tags=served_tags, agent_image=agent_image,
    )  # fmt: skip
    comment = f"nodeagent bundle {bundle_id} created {created}"
    keep = {b.digest for i in images for b in i.blobs} | {
        b.digest for c in carried_signatures for b in c.blobs
    }
    await asyncio.to_thread(
        _finish,
        output_dir,
        images,
        doc,
        secret_key,
        comment,
        platform=platform,
        extra=extra,
        keep=keep,
        ecdsa_key=ecdsa_key,
    )
    size_bytes = bundle.parse_manifest(doc).total_size_bytes
    blob_count = len(keep)
    return CreatedBundle(
        bundle_id, output_dir, tuple(images), blob_count, size_bytes, key_id, comment, target,
        carried, payload_count, carried_signatures, tuple(served_tags),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class PlannedBundle:
    """``plan_bundle``'s answer: what the bundle will hold, before a layer is fetched."""

    bundle_id: str
    images: tuple[PlannedImage, ...]
    sets: tuple[PinnedImageSet, ...]
    release: releases.BundleRelease | None = None
    payload_count: int = 0
    extra: dict[str, bytes] = field(default_factory=dict)
    """Files beside the layout (the release's signature files), path → bytes."""

    @property
    def blobs(self) -> dict[str, int]:
        """Digest → size of every blob of the images, each once."""
        return {b.digest: b.size_bytes for i in self.images for b in i.blobs}


async def plan_bundle(
    fetcher: ImageFetcher,
    refs: Sequence[PinnedImageRef],
    sets: Sequence[PinnedImageSet],
    *,
    bundle_id: str | None,
    target: BundleTarget | None,
    release: ReleaseRequest | None,
) -> PlannedBundle:
    """Step 2 (the module's docstring): the release's images and set added, the bundle id,
    and each image's plan (its manifests and config fetched into ``fetcher.blobs_dir``).
    ``bundle create`` and ``bundle create --dry-run`` (``adapters.bundles.dry_run``) share it."""
    platform = fetcher.client.platform
    carried, payload_count, extra = None, 0, dict[str, bytes]()
    if release is not None:
        refs, sets, carried, extra = await _with_release(fetcher, release, refs, sets)
        payload_count = len(sets[-1].images) - 1  # the release set: its image, then payload
    sets_json = [set_object(s) for s in sets]
    bundle_id = check_bundle_id(
        bundle_id or default_bundle_id(platform.architecture, refs, sets_json, target)
    )
    images = tuple([await fetcher.plan(ref, platform) for ref in refs])
    return PlannedBundle(bundle_id, images, tuple(sets), carried, payload_count, extra)


async def _with_release(
    fetcher: ImageFetcher,
    request: ReleaseRequest,
    refs: Sequence[PinnedImageRef],
    sets: Sequence[PinnedImageSet],
) -> tuple[list[PinnedImageRef], list[PinnedImageSet], releases.BundleRelease, dict[str, bytes]]:
    """``refs`` and ``sets`` with the release's images and set; its signature files."""
    _, payload = await fetch_release(fetcher, request.ref, fetcher.client.platform)
    if request.from_version:
        verdict = check_upgrade_path(request.from_version, payload.version, payload.previous)
        if not verdict.is_upgrade:
            raise ReleaseNotAnUpgrade(
                f"--from-version {clip(request.from_version, 64)}: {verdict.message}; no bundle "
                "was made (check the cluster's version: oc get clusterversion)"
            )
    set_name = request.set_name or releases.release_set_name(payload.version)
    is_persistent = all(s.is_persistent for s in sets)
    release_set = releases.release_set(payload, request.ref, set_name, is_persistent=is_persistent)
    if any(s.name == set_name for s in sets):
        raise SpecInvalid(f"PinnedImageSet {set_name} is defined twice (the release's set)")
    all_refs = dict.fromkeys([*release_set.images, *refs])
    files = {
        releases.signature_path(request.ref.digest, n): data
        for n, data in enumerate(request.signatures, start=1)
    }
    signatures = tuple(
        releases.ReleaseSignature(
            request.ref.digest, n, path, len(data), hashlib.sha256(data).hexdigest()
        )
        for n, (path, data) in enumerate(files.items(), start=1)
    )
    carried = releases.BundleRelease(
        request.ref, payload.version, set_name, signatures, previous=payload.previous
    )
    return list(all_refs), [*sets, release_set], carried, files


def signing_key_id(secret_key: minisign.SecretKey | None, ecdsa_key: bytes | None) -> str:
    """The key a bundle is shown as signed by (minisign's when both sign, as the nodes'
    anti-rollback marks hold it: ``ecdsa_signature.ManifestVerified``); the ECDSA key is
    checked here, before anything is fetched."""
    ecdsa_public = ecdsa_signature.public_key_of(ecdsa_key) if ecdsa_key is not None else None
    if secret_key is not None:
        return secret_key.public_key().key_id_hex
    if ecdsa_public is None:
        raise KeyMalformed("a bundle needs a signing key: a minisign key, an ECDSA key or both")
    return minisign.key_id_hex(ecdsa_public.key_id)


def layout_files(images: Sequence[PlannedImage]) -> dict[str, bytes]:
    return {"oci-layout": OCI_LAYOUT_BYTES, "index.json": index_doc(images)}


def _finish(
    output_dir: Path,
    images: Sequence[PlannedImage],
    doc: bytes,
    secret_key: minisign.SecretKey | None,
    comment: str,
    *,
    platform: Platform,
    extra: dict[str, bytes],
    keep: set[str],
    ecdsa_key: bytes | None = None,
) -> None:
    """Layout files, a check of the bundle as the verifier sees it, the signature, bundle.json;
    ``keep``: every listed blob's digest (others an interrupted run left are removed)."""
    blobs_dir = output_dir / "blobs" / "sha256"
    _remove_unlisted(blobs_dir, {digest.removeprefix("sha256:") for digest in keep})
    _fsync_dir(blobs_dir)
    for name, data in (layout_files(images) | extra).items():
        (output_dir / name).parent.mkdir(exist_ok=True)
        write_atomic(output_dir / name, data)
    bundle_media.check_signed_bundle(output_dir, bundle.parse_manifest(doc), platform)
    if secret_key is not None:
        signature = minisign.sign(doc, secret_key, trusted_comment=comment)
        write_atomic(output_dir / bundle.SIGNATURE_NAME, signature.encode())
    if ecdsa_key is not None:  # the same trusted comment: both must carry it (decision 0075)
        signature = ecdsa_signature.sign(doc, ecdsa_key, trusted_comment=comment)
        write_atomic(output_dir / bundle.ECDSA_SIGNATURE_NAME, signature.encode())
    write_atomic(output_dir / bundle.MANIFEST_NAME, doc)  # last: now it is a bundle
