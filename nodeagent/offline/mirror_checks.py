"""The drill's checks of the node mirror (docs/mirror.md): pods whose images are neither
pinned nor stored, and the registries.conf drop-in that points CRI-O at the mirror."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from nodeagent.errors import ImageReferenceInvalid, NodeAgentError
from nodeagent.offline.facts import Facts, NodeMirrorDropin
from nodeagent.offline.findings import Finding, finding
from nodeagent.offline.lookup import find_image, image_index, pinned_refs
from nodeagent.registries import parse_docker_reference, read_registries_conf

POD_IMAGE_NOT_HELD: Final = "PodImageNotHeld"
MIRROR_DROPIN_MISSING: Final = "NodeMirrorDropinMissing"
MIRROR_DROPIN_STALE: Final = "NodeMirrorDropinStale"
MAX_LISTED: Final = 5
"""Repositories named in one finding's message (the rest counted)."""


def _digest(image: str) -> str | None:
    try:
        return parse_docker_reference(image).digest
    except ImageReferenceInvalid:
        return None


def check_pods_held(facts: Facts) -> Iterator[Finding]:
    """A pod's image (by digest) that no pin covers and the store does not hold: once the
    runtime loses it, nothing on the node can bring it back without the registry."""
    if facts.stored_digests is None or facts.images is None:
        return
    index = image_index(facts.images)
    pinned = set(pinned_refs(facts))
    seen: set[str] = set()
    for pod_image in facts.pods or ():
        digest = _digest(pod_image.image)
        if digest is None or pod_image.image in seen:
            continue  # by tag: PodImageByTag says so
        seen.add(pod_image.image)
        image = find_image(index, pod_image.image)
        is_pinned = pod_image.image in pinned or (image is not None and image.is_pinned)
        if is_pinned or digest in facts.stored_digests:
            continue
        pod = pod_image.pod
        yield finding(
            POD_IMAGE_NOT_HELD,
            f"pod {pod.namespace}/{pod.name} container {pod_image.container} runs "
            f"{pod_image.image}, which no pin covers and the node's store does not hold: "
            "once the runtime removes it, it needs the registry",
            "add it by digest to a PinnedImageSet, a bundle or a registry set",
            subject=pod_image.image,
            pod=pod,
        )


def _missing_mirrors(dropin: NodeMirrorDropin, text: str) -> tuple[list[str], list[str]]:
    """The stored repositories the drop-in does not mirror to ``listen``, and the ones it
    mirrors that the store does not hold."""
    conf = read_registries_conf([("registries.conf", ""), (dropin.path, text)])
    mirrored = {
        entry.prefix
        for entry in conf.entries
        if any(
            m.location == f"{dropin.listen}/{entry.prefix.partition('/')[2]}" for m in entry.mirrors
        )
    }
    return sorted(dropin.repositories - mirrored), sorted(mirrored - dropin.repositories)


def _listed(names: list[str]) -> str:
    more = len(names) - MAX_LISTED
    return ", ".join(names[:MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def check_mirror_dropin(facts: Facts) -> Iterator[Finding]:
    dropin = facts.mirror_dropin
    if dropin is None or not dropin.repositories:
        return
    if dropin.text is None:
        yield finding(
            MIRROR_DROPIN_MISSING,
            f"the node mirror's drop-in {dropin.path} does not exist: CRI-O does not pull the "
            f"{len(dropin.repositories)} repositories the store holds from the node mirror",
            "restart nodeagent (it writes the drop-in), or see docs/mirror.md",
            subject=dropin.path,
        )
        return
    try:
        lacking, extra = _missing_mirrors(dropin, dropin.text)
    except NodeAgentError as err:
        lacking, extra = sorted(dropin.repositories), [f"(unreadable: {err.message})"]
    if lacking or extra:
        parts = [f"does not mirror {_listed(lacking)} to {dropin.listen}"] if lacking else []
        parts += [f"mirrors {_listed(extra)}, which the store does not hold"] if extra else []
        yield finding(
            MIRROR_DROPIN_STALE,
            f"the node mirror's drop-in {dropin.path} " + "; ".join(parts),
            "restart nodeagent (it rewrites the drop-in when the store changes)",
            subject=dropin.path,
        )
