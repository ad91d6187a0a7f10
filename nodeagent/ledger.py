"""What nodeagent remembers between runs: the ledger, a typed value kept as a JSON document.

Per PinnedImageSet: its generations (MachineConfigNode semantics: they never
decrease), the fingerprint of its image list, and the images it had pinned.
Transient sets (specs under /run) are forgotten when the boot id changes, so a
reboot never resurrects them; persistent sets are pinned again at start
before anything else.

The document's keys (``bootId``, ``sets``, ``desiredGeneration`` …) are those of
earlier versions, so an upgraded daemon reads the ledger an older one wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SetRecord:
    """One set's generations and the images it had pinned at its current generation."""

    desired_generation: int = 0
    current_generation: int | None = None
    last_failed_generation: int | None = None
    last_failed_error: str | None = None
    fingerprint: str | None = None
    is_persistent: bool = False
    pinned_images: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SetRecord:
        return cls(
            desired_generation=_int(doc.get("desiredGeneration")) or 0,
            current_generation=_int(doc.get("currentGeneration")),
            last_failed_generation=_int(doc.get("lastFailedGeneration")),
            last_failed_error=_str(doc.get("lastFailedError")),
            fingerprint=_str(doc.get("fingerprint")),
            is_persistent=doc.get("persistent") is True,
            pinned_images=tuple(
                image for image in doc.get("pinnedImages") or () if isinstance(image, str)
            ),
        )

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "desiredGeneration": self.desired_generation,
            "persistent": self.is_persistent,
        }
        optional = {
            "fingerprint": self.fingerprint,
            "currentGeneration": self.current_generation,
            "lastFailedGeneration": self.last_failed_generation,
            "lastFailedError": self.last_failed_error,
        }
        doc |= {key: value for key, value in optional.items() if value is not None}
        if self.current_generation is not None or self.pinned_images:
            doc["pinnedImages"] = list(self.pinned_images)
        return doc


@dataclass(slots=True)
class Ledger:
    boot_id: str
    sets: dict[str, SetRecord] = field(default_factory=dict)

    @classmethod
    def for_boot(cls, doc: Mapping[str, Any] | None, boot_id: str) -> Ledger:
        """The stored ledger; after a reboot, without the transient sets."""
        if not doc or not isinstance(doc.get("sets"), dict):
            return cls(boot_id)
        sets = {
            str(name): SetRecord.from_json(item)
            for name, item in doc["sets"].items()
            if isinstance(item, dict)
        }
        if doc.get("bootId") != boot_id:
            sets = {name: record for name, record in sets.items() if record.is_persistent}
        return cls(boot_id, sets)

    def to_json(self) -> dict[str, Any]:
        return {
            "bootId": self.boot_id,
            "sets": {name: record.to_json() for name, record in self.sets.items()},
        }

    def entry(self, name: str) -> SetRecord:
        """The set's record, created (generation 0) when the set is new."""
        return self.sets.setdefault(name, SetRecord())

    def observe_spec(
        self, name: str, fingerprint: str, spec_generation: int | None, *, is_persistent: bool
    ) -> int:
        """Record the set's current spec; return its desired generation.

        A spec's own ``metadata.generation`` is used when given (and never lowers
        the generation); otherwise the generation goes up by one whenever the
        image list changes.
        """
        record = self.entry(name)
        previous = record.desired_generation
        if spec_generation is not None:
            generation = max(previous, spec_generation)
        elif record.fingerprint != fingerprint:
            generation = previous + 1
        else:
            generation = max(previous, 1)
        record.fingerprint = fingerprint
        record.desired_generation = generation
        record.is_persistent = is_persistent
        return generation

    def record_pinned(self, name: str, generation: int, images: Iterable[str]) -> None:
        record = self.entry(name)
        record.current_generation = max(record.current_generation or 0, generation)
        record.pinned_images = tuple(sorted(set(images)))
        record.last_failed_generation = None
        record.last_failed_error = None

    def record_failed(self, name: str, generation: int, error: str) -> None:
        record = self.entry(name)
        record.last_failed_generation = max(record.last_failed_generation or 0, generation)
        record.last_failed_error = error

    def forget(self, names: Iterable[str]) -> list[str]:
        """Drop sets that no longer exist; return the images they had pinned."""
        released: list[str] = []
        for name in list(names):
            gone = self.sets.pop(name, None)
            if gone is not None:
                released.extend(gone.pinned_images)
        return released

    def pinned_images(self, *, is_persistent_only: bool = False) -> set[str]:
        """Every image the ledger says is pinned (optionally only persistent sets')."""
        return {
            image
            for record in self.sets.values()
            if record.is_persistent or not is_persistent_only
            for image in record.pinned_images
        }

    def pinned_of(self, name: str) -> set[str]:
        record = self.sets.get(name)
        return set(record.pinned_images) if record is not None else set()


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None
