"""Tags a bundle serves: ``bundle create --serve-tags``, signed tag → digest, frozen.

A bundle names images by digest. Some consumers pull by tag, and with
``imagePullPolicy: Always`` the kubelet asks the runtime to pull that tag every time a
container starts (OLM's catalog pods are the use). A bundle created with ``--serve-tags``
records, for an image given as ``host/repo:tag@sha256:…``, the tag and the digest it
named at creation in ``bundle.json``'s ``servedTags`` (format 3), under the bundle's
signature. The node's mirrors then answer ``GET/HEAD /v2/<repo>/manifests/<tag>`` with
exactly that digest's manifest, and nothing for a tag no verified manifest lists
(docs/bundle-format.md, "Served tags"; docs/mirror.md, "Tags").

A served tag is frozen: while a mirror answers it, the runtime gets the signed digest even
when the registry is back and has moved the tag. That is the point of carrying it, and the
reason it is opt-in per bundle and listed by ``nodeagent status`` (docs/decisions/0059).

Pure functions only: ``served_tags_of`` reads and checks ``servedTags``, ``tags_doc``
writes it, ``split_tagged`` reads ``--image`` texts, ``tag_names`` gives the mirror's
lookup (``<repository path>/<tag>`` → digest, the key ``signatures.served_tags`` uses).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.bundles.signatures import ImageSignature, repository_path, served_tags, tag_digest
from nodeagent.bundles.target import FRESHNESS_FORMAT_VERSION
from nodeagent.errors import BundleTagsInvalid, ImageReferenceInvalid
from nodeagent.references import PinnedImageRef, parse_pinned_image_ref
from nodeagent.strict import quoted

TAGS_KEY: Final = "servedTags"
MAX_SERVED_TAGS: Final = 1024
"""Tags one bundle may serve: an OLM catalog per minor release and channel is a few dozen."""
MAX_TAG_KEY_CHARS: Final = 512
"""``host/repository:tag``: a reference is at most 255+ characters, a tag 128."""
TAG: Final = re.compile(r"^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$")
"""A tag, as the OCI distribution spec defines it."""
_DIGEST: Final = re.compile(r"^sha256:[a-f0-9]{64}$")


@dataclass(frozen=True, slots=True)
class ServedTag:
    """One tag a bundle serves: the carried image it names, and the tag."""

    image: PinnedImageRef
    tag: str

    @property
    def reference(self) -> str:
        """``host/repository:tag``: what a pod names, and ``servedTags``' key."""
        return f"{self.image.name}:{self.tag}"

    @property
    def served_name(self) -> str:
        """``<repository path>/<tag>``: what the runtime asks a mirror for."""
        return f"{repository_path(self.image)}/{self.tag}"


def is_tag(text: object) -> bool:
    """A tag of the OCI distribution spec that is not a sigstore signature's."""
    return isinstance(text, str) and TAG.match(text) is not None and tag_digest(text) is None


def split_tagged(text: str) -> tuple[str, str | None]:
    """``host/repo:tag@sha256:…`` → (``host/repo@sha256:…``, ``tag``); other texts unchanged
    with no tag. Only the last path component may hold the tag (a ``:`` before the first
    ``/`` is the host's port)."""
    name, at, digest = text.partition("@")
    head, slash, last = name.rpartition("/")
    if not at or not slash or ":" not in last:
        return text, None
    repository, _, tag = last.partition(":")
    return f"{head}/{repository}@{digest}", tag


def tags_doc(tags: Iterable[ServedTag]) -> dict[str, str]:
    """``servedTags`` as ``bundle.json`` holds it: ``host/repository:tag`` → digest, sorted."""
    return {t.reference: t.image.digest for t in sorted(tags, key=lambda t: t.reference)}


def tag_names(tags: Iterable[ServedTag]) -> dict[str, str]:
    """``<repository path>/<tag>`` → manifest digest: the tags a mirror answers."""
    return {t.served_name: t.image.digest for t in tags}


def answered_tags(
    signatures: Iterable[ImageSignature], tags: Iterable[ServedTag]
) -> dict[str, str]:
    """Every tag a verified manifest lets a mirror answer, ``<repository path>/<tag>`` →
    digest: its images' signature tags (``imageSignatures``) and its served tags."""
    return served_tags(signatures) | tag_names(tags)


def tagged_repositories(tags: Iterable[ServedTag]) -> frozenset[PinnedImageRef]:
    """One image of each repository with a served tag (the drop-in's tag-only entries)."""
    return frozenset(t.image for t in tags)


def served_tags_of(
    doc: Mapping[str, Any], images: Iterable[PinnedImageRef]
) -> tuple[ServedTag, ...]:
    """``bundle.json``'s ``servedTags`` (format 3, rule R42): an object of at most
    ``MAX_SERVED_TAGS`` entries ``host/repository:tag`` → digest, each tag of the OCI
    grammar and not a sigstore tag, each digest one of the bundle's images of that very
    repository (as ``images[]`` spells it)."""
    if TAGS_KEY not in doc:
        return ()
    version = doc.get("formatVersion")
    if not isinstance(version, int) or version < FRESHNESS_FORMAT_VERSION:
        raise BundleTagsInvalid(
            f"bundle.json: {TAGS_KEY} needs formatVersion {FRESHNESS_FORMAT_VERSION}"
        )
    items = doc[TAGS_KEY]
    if not isinstance(items, dict) or not 1 <= len(items) <= MAX_SERVED_TAGS:
        raise BundleTagsInvalid(
            f"bundle.json: {TAGS_KEY} must be an object of 1 to {MAX_SERVED_TAGS} tags"
        )
    carried = {(ref.name, ref.digest): ref for ref in images}
    return tuple(_served_tag(key, value, carried) for key, value in items.items())


def _served_tag(
    key: str, value: object, carried: Mapping[tuple[str, str], PinnedImageRef]
) -> ServedTag:
    where = f"bundle.json {TAGS_KEY} {quoted(key, 120)}"
    name, _, tag = key.rpartition(":")
    if len(key) > MAX_TAG_KEY_CHARS or "/" in tag or not name or not is_tag(tag):
        raise BundleTagsInvalid(
            f"{where}: must be host/repository:tag, the tag 1-128 of [A-Za-z0-9_.-] not "
            "starting with . or - (and not a sigstore tag sha256-<hex>.sig)"
        )
    if not isinstance(value, str) or not _DIGEST.match(value):
        raise BundleTagsInvalid(f"{where}: {quoted(value, 80)} is not a sha256 digest")
    image = carried.get((name, value))
    if image is None:
        raise BundleTagsInvalid(
            f"{where}: {value} is not an image the bundle carries for {quoted(name, 200)}"
        )
    return ServedTag(image, tag)


# ---------------------------------------------------------------- bundle create --image
def served_tags_of_images(image_texts: Iterable[str]) -> list[ServedTag]:
    """The tags ``--image host/repo:tag@sha256:…`` names (``--serve-tags``), each once; a
    tag given twice for one repository must name one digest."""
    found: dict[str, ServedTag] = {}
    for text in image_texts:
        ref, tag = image_option(text, is_serving_tags=True)
        if tag is None:
            continue
        served = ServedTag(ref, tag)
        if found.setdefault(served.reference, served) != served:
            raise ImageReferenceInvalid(
                f"--image names the tag {served.reference} with two digests; keep one"
            )
    return list(found.values())


def image_option(text: str, *, is_serving_tags: bool) -> tuple[PinnedImageRef, str | None]:
    """One ``--image`` text: its digest reference, and the tag it names (``--serve-tags``)."""
    untagged, tag = split_tagged(text.strip())
    if tag is not None and not is_serving_tags:
        raise ImageReferenceInvalid(
            f"--image {quoted(text.strip(), 300)} names a tag; a bundle serves tags only when made "
            "with --serve-tags, otherwise give NAME@sha256:… alone"
        )
    if tag is not None and not is_tag(tag):
        raise ImageReferenceInvalid(
            f"--image {quoted(text.strip(), 300)}: the tag must be 1-128 of [A-Za-z0-9_.-], not "
            "starting with . or -, and not a sigstore tag"
        )
    try:
        return parse_pinned_image_ref(untagged), tag
    except ImageReferenceInvalid as err:
        raise ImageReferenceInvalid(
            f"--image {err.message}; a bundle names images by digest: resolve a tag with "
            "`skopeo inspect --format '{{.Digest}}' docker://NAME:TAG`"
            + (" and give NAME:TAG@DIGEST" if is_serving_tags else "")
        ) from None
