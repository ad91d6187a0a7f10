"""Pinned images the runtime no longer has: told apart, reported once, restored first.

CRI-O may remove images behind nodeagent's back: after an unclean shutdown it wipes its
whole image store (``crio wipe``, older versions and configurations) or removes every
image it finds damaged (the repair path of newer ones); an admin may remove one by hand.
The pins stay in place throughout (the drop-in is nodeagent's), but the images behind
them must come back. A sync compares what the ledger says is pinned with what the
runtime lists:

* ``RuntimeStorageWiped``: none of the pinned images is there and the runtime lists no
  image at all (the store was emptied);
* ``RuntimeImagesLost``: some (or all) pinned images are gone while others remain.

The images are then restored from the node's local store first (``ImageRestorer``,
no network), and only the rest from their registries.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from nodeagent.prepull import PullResult

WIPED: Final = "RuntimeStorageWiped"
LOST: Final = "RuntimeImagesLost"
SHOWN_IMAGES: Final = 5
"""A loss's message names this many images, then says how many more."""


@dataclass(frozen=True, slots=True)
class ImageLoss:
    """Pinned images found missing at one sync."""

    reason: str
    lost: tuple[str, ...]
    pinned: int
    """How many images the ledger said were pinned."""
    at: str
    restored_from_store: int = 0
    """Of ``lost``, brought back from the local store (filled in after the restore)."""
    is_resolved: bool = False
    """A later sync found none missing (the loss stays in the status until the next one)."""

    @property
    def message(self) -> str:
        shown = ", ".join(self.lost[:SHOWN_IMAGES])
        more = len(self.lost) - SHOWN_IMAGES
        names = shown + (f" and {more} more" if more > 0 else "")
        if self.reason == WIPED:
            return (
                f"the runtime's image store was emptied: all {self.pinned} pinned images are "
                f"gone ({names}); {self._outcome()}"
            )
        return (
            f"{len(self.lost)} of {self.pinned} pinned images are gone from the runtime "
            f"({names}); {self._outcome()}"
        )

    def _outcome(self) -> str:
        """Where the images stand now: the status keeps the loss after they are back."""
        if self.is_resolved or self.restored_from_store >= len(self.lost):
            how = " from the local store" if self.restored_from_store else ""
            return f"they stayed pinned and were brought back{how}"
        return "they stay pinned and are being brought back"

    def to_json(self) -> dict[str, object]:
        return {
            "reason": self.reason,
            "at": self.at,
            "imagesLost": len(self.lost),
            "imagesPinned": self.pinned,
            "restoredFromStore": self.restored_from_store,
            "resolved": self.is_resolved,
            "message": self.message,
        }


def find_loss(
    pinned: Collection[str], present: Iterable[str], runtime_images: int, at: str
) -> ImageLoss | None:
    """The pinned images missing from the runtime, classified; None when none is missing.

    ``present``: the lower-cased names the runtime lists now; ``runtime_images``: how many
    images it lists in all.
    """
    names = set(present)
    lost = tuple(sorted(ref for ref in pinned if ref.lower() not in names))
    if not lost:
        return None
    reason = WIPED if len(lost) == len(pinned) and runtime_images == 0 else LOST
    return ImageLoss(reason, lost, len(pinned), at)


def is_new(loss: ImageLoss, previous: ImageLoss | None) -> bool:
    """Report a loss once: not again at every retry while the same images are missing."""
    return previous is None or previous.is_resolved or not set(loss.lost) <= set(previous.lost)


def restored_count(loss: ImageLoss, results: Mapping[str, bool]) -> int:
    """How many of the lost images a restore brought back (``results``: ref -> pulled)."""
    return sum(1 for ref in loss.lost if results.get(ref, False))


class ImageRestorer(Protocol):
    """Brings images back from the node's local store, without any network
    (``bundles.restore.StoreRestorer``: the store served on loopback as a mirror)."""

    async def holds(self, refs: Sequence[str]) -> list[str]:
        """Those of ``refs`` the store can restore (their manifests and blobs are in it)."""
        ...

    async def restore(self, refs: Sequence[str]) -> Mapping[str, PullResult]: ...
