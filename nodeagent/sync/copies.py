"""Registry sets kept in the node's image store (``[store] registry_sets``): port and values.

With the option on, images of a set loaded from a spec (not from a bundle) that are
missing from the runtime and that the store cannot restore are fetched from their
registry into the store once, then pulled into the runtime from the store like a
restore: the registry is read once, and after a power cut they come back with no
network. The reconciler admits them against the runtime's disk first (``disk``); the
store admits its own copy (size cap, free space) before the first byte. A failure there
never holds pinning back: the images are then pulled from the registry as without the
option, and the journal says why (docs/store.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from nodeagent.status import DiskStatus

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SetImages:
    """One set as the store sees it in a sync."""

    name: str
    refs: tuple[str, ...]
    """Every image of the set's current generation."""
    missing: tuple[str, ...]
    """Of those, the ones to fetch into the store (missing, not restorable, admitted)."""
    pinned: tuple[str, ...]
    """What the set pins now (a new generation may still be incomplete): kept recorded."""


@dataclass(frozen=True, slots=True)
class StoreFailure:
    set_name: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class StoredFromRegistry:
    """What a pass stored: the images the store can now restore, and each set it could not."""

    refs: tuple[str, ...] = ()
    fetched_bytes: int = 0
    failures: tuple[StoreFailure, ...] = ()


class RegistryStore(Protocol):
    """``adapters.store.registry_sets.RegistrySets``: fetch into the store, record, prune."""

    async def store(
        self, sets: Sequence[SetImages], images_need: DiskStatus | None
    ) -> StoredFromRegistry:
        """Fetch each set's ``missing`` images into the store (``images_need``: what the
        runtime's disk admission needs, counted too when the store shares its filesystem)
        and rewrite each set's record to its ``refs`` and ``pinned`` images."""
        ...


def registry_wants(
    sets: Iterable[tuple[str, Sequence[str]]],
    pinned: Mapping[str, Iterable[str]],
    to_fetch: Iterable[str],
) -> list[SetImages]:
    """Per set (name, refs): its images, those of ``to_fetch`` it has, what it pins now."""
    fetch = set(to_fetch)
    return [
        SetImages(
            name,
            tuple(refs),
            tuple(ref for ref in refs if ref in fetch),
            tuple(sorted(pinned.get(name, ()))),
        )
        for name, refs in sets
    ]


def admitted_only(sets: Sequence[SetImages], admitted: Iterable[str]) -> list[SetImages]:
    """The sets, with nothing to fetch for those the runtime's disk admission refused."""
    names = set(admitted)
    return [s if s.name in names else SetImages(s.name, s.refs, (), s.pinned) for s in sets]


def log_outcome(outcome: StoredFromRegistry, todo: Sequence[str]) -> list[str]:
    """Say what a pass stored and each set it could not (a warning with its reason code,
    the images then go to the registry pull); the images of ``todo`` now in the store."""
    for failure in outcome.failures:
        log.warning(
            "registry_set_not_stored",
            set=failure.set_name,
            reason=failure.reason,
            error=failure.message,
            next="pulled from the image's registry, not kept in the local store",
        )
    held = set(outcome.refs)
    stored = [ref for ref in todo if ref in held]
    if stored:
        log.info(
            "registry_images_stored",
            images=len(stored),
            bytes=outcome.fetched_bytes,
            message=f"kept {len(stored)} registry images in the local store",
        )
    return stored
