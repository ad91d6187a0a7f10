"""CRI answers checked while they become nodeagent's values.

The runtime is trusted to run containers, not to send sane numbers: a protobuf ``uint64``
can hold 2^64-1, a string any length and any bytes. Every value is range-checked here;
one that no runtime could mean (an image of 2^63 bytes, a mountpoint that is not an
absolute path, a tag with a newline, a million images) makes the whole answer
``RuntimeCallFailed`` with a clipped message, never an exception of another kind and
never a number that later overflows a sum or a status field.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from nodeagent.adapters.cri.api import runtime_v1_pb2 as pb
from nodeagent.errors import RuntimeCallFailed
from nodeagent.ports import FilesystemUsage, RunningContainer, RuntimeVersion, StoredImage
from nodeagent.strict import clip

MAX_IMAGES: Final = 100_000
"""Images in one ListImages answer. A busy node holds hundreds; each takes ~300 bytes on the
wire, so 100,000 fit the message bound (``client.MAX_MESSAGE_BYTES``) with room to spare."""
MAX_IMAGE_BYTES: Final = 2**50
"""Largest believable image size (1 PiB); a uint64 near 2^64 is a runtime's bug, not data."""
MAX_FS_BYTES: Final = 2**63 - 1
"""Used bytes and inodes of an image filesystem: what the kernel counts in (``off_t``)."""
MAX_FILESYSTEMS: Final = 64
MAX_NAMES: Final = 4096
"""Tags plus digests of one image."""
MAX_NAME_CHARS: Final = 1024
"""One tag or digest name (a reference is at most ~460 characters)."""
MAX_ID_CHARS: Final = 256
MAX_PATH_CHARS: Final = 4096
MAX_VERSION_CHARS: Final = 256

_NAME = re.compile(r"[^\s\x00-\x1f\x7f]+")
_DIGEST_NAME = re.compile(r"[^\s@\x00-\x1f\x7f]+@[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+")


def _nonsense(call: str, what: str) -> RuntimeCallFailed:
    return RuntimeCallFailed(f"{call}: the runtime answered nonsense: {what}")


def _checked_int(call: str, field: str, value: int, high: int) -> int:
    if not 0 <= value <= high:
        raise _nonsense(call, f"{field} {value} is not between 0 and {high}")
    return value


def _checked_text(call: str, field: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise _nonsense(call, f"{field} of {len(value)} characters (at most {limit})")
    return value


def _names(
    call: str, field: str, values: Sequence[str], pattern: re.Pattern[str]
) -> tuple[str, ...]:
    for value in values:
        if len(value) > MAX_NAME_CHARS or pattern.fullmatch(value) is None:
            raise _nonsense(call, f"{field} '{clip(value, 120)}' is not an image name")
    return tuple(values)


def stored_image(msg: pb.Image, call: str = "ListImages") -> StoredImage:
    """Convert a CRI ``Image`` message; ``RuntimeCallFailed`` for values out of range."""
    if len(msg.repo_tags) + len(msg.repo_digests) > MAX_NAMES:
        raise _nonsense(call, f"an image with {len(msg.repo_tags) + len(msg.repo_digests)} names")
    return StoredImage(
        id=clip(_checked_text(call, "image id", msg.id, MAX_ID_CHARS), MAX_ID_CHARS),
        repo_tags=_names(call, "repo tag", msg.repo_tags, _NAME),
        repo_digests=_names(call, "repo digest", msg.repo_digests, _DIGEST_NAME),
        size_bytes=_checked_int(call, "image size", msg.size, MAX_IMAGE_BYTES),
        is_pinned=msg.pinned,
    )


def stored_images(msg: pb.ListImagesResponse) -> list[StoredImage]:
    """Every image of a ListImages answer, at most ``MAX_IMAGES``."""
    if len(msg.images) > MAX_IMAGES:
        raise _nonsense("ListImages", f"{len(msg.images)} images (at most {MAX_IMAGES})")
    return [stored_image(image) for image in msg.images]


def filesystem_usages(msg: pb.ImageFsInfoResponse) -> list[FilesystemUsage]:
    """The image filesystems of an ImageFsInfo answer, each checked."""
    call = "ImageFsInfo"
    if len(msg.image_filesystems) > MAX_FILESYSTEMS:
        raise _nonsense(call, f"{len(msg.image_filesystems)} image filesystems")
    usages = []
    for usage in msg.image_filesystems:
        mountpoint = usage.fs_id.mountpoint
        if not mountpoint.startswith("/") or "\0" in mountpoint or len(mountpoint) > MAX_PATH_CHARS:
            raise _nonsense(call, f"mountpoint '{clip(mountpoint, 120)}' is not an absolute path")
        usages.append(
            FilesystemUsage(
                mountpoint=mountpoint,
                used_bytes=_checked_int(call, "used bytes", usage.used_bytes.value, MAX_FS_BYTES),
                inodes_used=_checked_int(
                    call, "used inodes", usage.inodes_used.value, MAX_FS_BYTES
                ),
            )
        )
    return usages


def runtime_version(msg: pb.VersionResponse) -> RuntimeVersion:
    """The runtime's name and versions, clipped and escaped (they reach status and journal)."""
    return RuntimeVersion(
        runtime_name=clip(msg.runtime_name, MAX_VERSION_CHARS),
        runtime_version=clip(msg.runtime_version, MAX_VERSION_CHARS),
        runtime_api_version=clip(msg.runtime_api_version, MAX_VERSION_CHARS),
    )


def image_ref(call: str, value: str) -> str:
    """The ``image_ref`` a pull answered: one name, bounded (empty: the caller asks by name)."""
    if not value:
        return value
    if len(value) > MAX_NAME_CHARS or _NAME.fullmatch(value) is None:
        raise _nonsense(call, f"image reference '{clip(value, 120)}'")
    return value


MAX_CONTAINERS: Final = 100_000
"""Containers in one ListContainers answer (a node runs hundreds at most)."""
POD_NAME_LABEL: Final = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL: Final = "io.kubernetes.pod.namespace"
MAX_LABEL_CHARS: Final = 253


def running_containers(msg: pb.ListContainersResponse) -> list[RunningContainer]:
    """The containers of a ListContainers answer, names checked and clipped."""
    call = "ListContainers"
    if len(msg.containers) > MAX_CONTAINERS:
        raise _nonsense(call, f"{len(msg.containers)} containers (at most {MAX_CONTAINERS})")
    found = []
    for item in msg.containers:
        image = _checked_text(call, "container image", item.image.image, MAX_NAME_CHARS)
        image_ref = _checked_text(call, "container image_ref", item.image_ref, MAX_NAME_CHARS)
        labels = item.labels
        found.append(
            RunningContainer(
                id=clip(_checked_text(call, "container id", item.id, MAX_ID_CHARS), MAX_ID_CHARS),
                name=clip(item.metadata.name, MAX_LABEL_CHARS),
                image=clip(image, MAX_NAME_CHARS),
                image_ref=clip(image_ref, MAX_NAME_CHARS),
                pod_namespace=clip(labels.get(POD_NAMESPACE_LABEL, ""), MAX_LABEL_CHARS),
                pod_name=clip(labels.get(POD_NAME_LABEL, ""), MAX_LABEL_CHARS),
            )
        )
    return found
