"""Finding an image the runtime stores by any name it goes by (the checks' lookups, pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nodeagent.errors import ImageReferenceInvalid
from nodeagent.offline.facts import Facts
from nodeagent.ports import StoredImage
from nodeagent.registries import parse_docker_reference


def image_index(images: Iterable[StoredImage]) -> dict[str, StoredImage]:
    """Every name and id the runtime knows an image by, lower-case, to the image."""
    index: dict[str, StoredImage] = {}
    for image in images:
        index[image.id.lower()] = image
        index[image.id.lower().removeprefix("sha256:")] = image
        for name in image.names():
            index[name.lower()] = image
    return index


def _normalized(ref: str) -> str | None:
    """``ref`` with docker's default host and namespace (``pause:3`` -> ``docker.io/library/…``)."""
    try:
        parsed = parse_docker_reference(ref)
    except ImageReferenceInvalid:
        return None
    text = f"{parsed.registry}/{parsed.repository}"
    if parsed.tag:
        text += f":{parsed.tag}"
    if parsed.digest:
        text += f"@{parsed.digest}"
    return text


def find_image(index: Mapping[str, StoredImage], ref: str) -> StoredImage | None:
    """The stored image ``ref`` names (as given, normalized, or its digest alone), or None."""
    for key in (ref, _normalized(ref) or ref):
        if key.lower() in index:
            return index[key.lower()]
    return None


def pinned_refs(facts: Facts) -> list[str]:
    """Every image of every set, once, in set order."""
    seen: dict[str, None] = {}
    for pinned_set in facts.sets or ():
        seen.update(dict.fromkeys(pinned_set.images))
    return list(seen)
