"""The ledger: a typed value kept as a JSON document.

Per PinnedImageSet: its generations (MachineConfigNode semantics: they never
decrease), the fingerprint of its image list, the images it had pinned, and the
spec file it was last loaded from (so a file that turns invalid keeps its sets,
see ``Ledger.held``). Transient sets (specs under /run) are forgotten when the boot
id changes, so a reboot never resurrects them; persistent sets are pinned again at
start before anything else.

The document's keys (``bootId``, ``sets``, ``desiredGeneration`` …) are those of
earlier versions, so an upgraded daemon reads the ledger an older one wrote. It is
read strictly: a document of the wrong shape is damaged (``StateFileDamaged``), never
half-read (an image list read as its characters would unpin everything).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent.errors import StateFileDamaged
from nodeagent.strict import clip

MAX_GENERATION = 2**63 - 1
"""Generations are Kubernetes int64 values."""
MAX_TEXT_CHARS = 65536
"""Longest string field (an error text is cut at 32768 characters before it is stored)."""
MAX_IMAGE_CHARS = 1024
"""Longest image reference in ``pinnedImages`` (a reference is at most ~460 characters)."""
MAX_SET_IMAGES = 10_000
"""Images of one entry (a set holds at most 500)."""
MAX_SET_NAME_CHARS = 253
"""A set's name is a Kubernetes object name (DNS subdomain)."""


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
    source: str | None = None
    """The spec file the set was last loaded from (None: not known, an older ledger)."""

    @classmethod
    def from_json(cls, doc: Any, where: str) -> SetRecord:
        """Read one entry strictly; ``StateFileDamaged`` names the entry and the field."""
        if not isinstance(doc, dict):
            raise StateFileDamaged(f"{where} is a {type(doc).__name__}, not an object")
        images = typed_value(doc, "pinnedImages", list, where) or []
        if len(images) > MAX_SET_IMAGES or not all(
            isinstance(image, str) and 0 < len(image) <= MAX_IMAGE_CHARS for image in images
        ):
            raise StateFileDamaged(
                f"{where}: pinnedImages must be a list of strings (at most {MAX_SET_IMAGES} "
                "image names)"
            )
        return cls(
            desired_generation=generation_value(doc, "desiredGeneration", where) or 0,
            current_generation=generation_value(doc, "currentGeneration", where),
            last_failed_generation=generation_value(doc, "lastFailedGeneration", where),
            last_failed_error=typed_value(doc, "lastFailedError", str, where),
            fingerprint=typed_value(doc, "fingerprint", str, where),
            is_persistent=typed_value(doc, "persistent", bool, where) is True,
            pinned_images=tuple(images),
            source=typed_value(doc, "source", str, where),
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
            "source": self.source,
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
        """The stored ledger (None: never saved); after a reboot, without the transient sets.

        Raises ``StateFileDamaged`` for a document nodeagent cannot have written.
        """
        if doc is None:
            return cls(boot_id)
        sets = doc.get("sets")
        stored_boot = doc.get("bootId")
        if not isinstance(sets, dict) or not _is_boot_id(stored_boot):
            raise StateFileDamaged("the ledger has no 'sets' object (or a 'bootId' not a string)")
        records = {}
        for name, item in sets.items():
            where = f"ledger entry '{clip(name, 100)}'"
            if not 0 < len(name) <= MAX_SET_NAME_CHARS:
                raise StateFileDamaged(f"{where}: a set name of {len(name)} characters")
            records[name] = SetRecord.from_json(item, where)
        if stored_boot != boot_id:
            records = {name: record for name, record in records.items() if record.is_persistent}
        return cls(boot_id, records)

    def to_json(self) -> dict[str, Any]:
        return {
            "bootId": self.boot_id,
            "sets": {name: record.to_json() for name, record in self.sets.items()},
        }

    def entry(self, name: str) -> SetRecord:
        """The set's record, created (generation 0) when the set is new."""
        return self.sets.setdefault(name, SetRecord())

    def observe_spec(
        self,
        name: str,
        fingerprint: str,
        spec_generation: int | None,
        *,
        is_persistent: bool,
        source: str | None = None,
    ) -> int:
        """Record the set's current spec; return its desired generation.

        A spec's own ``metadata.generation`` is used when given (and never lowers
        the generation); otherwise the generation goes up by one whenever the
        image list changes. A record seeded without a fingerprint (a rebuild from
        the published status) keeps its generation: the list is not known to differ.
        """
        record = self.entry(name)
        previous = record.desired_generation
        if spec_generation is not None:
            generation = max(previous, spec_generation)
        elif record.fingerprint is None and previous > 0:
            generation = previous
        elif record.fingerprint != fingerprint:
            generation = previous + 1
        else:
            generation = max(previous, 1)
        record.fingerprint = fingerprint
        record.desired_generation = generation
        record.is_persistent = is_persistent
        if source is not None:
            record.source = source
        return generation

    def seed(self, name: str, seed: SetRecord) -> None:
        """Raise this set's generations to at least ``seed``'s (a rebuild never resets them).

        The seed's other fields fill only what the record does not know yet.
        """
        record = self.entry(name)
        record.desired_generation = max(record.desired_generation, seed.desired_generation)
        record.current_generation = _max_or_none(record.current_generation, seed.current_generation)
        record.last_failed_generation = _max_or_none(
            record.last_failed_generation, seed.last_failed_generation
        )
        record.last_failed_error = record.last_failed_error or seed.last_failed_error
        record.source = record.source or seed.source
        record.is_persistent = record.is_persistent or seed.is_persistent
        record.pinned_images = record.pinned_images or seed.pinned_images

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

    def held(self, loaded: Collection[str], problem_sources: Iterable[str]) -> dict[str, str]:
        """Sets that did not load but whose file (or directory) has a problem: name -> source.

        Such a set stands at its last good generation: an invalid, empty or half-written
        file is not a removal. Only a file that is gone, or that loads without the set,
        lets it go.
        """
        sources = [source.rstrip("/") for source in problem_sources]
        held: dict[str, str] = {}
        for name, record in self.sets.items():
            origin = record.source
            if name in loaded or origin is None:
                continue
            if any(origin == s or origin.startswith(s + "/") for s in sources):
                held[name] = origin
        return held

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


def typed_value(doc: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    """``doc[key]`` when absent or of ``kind`` (str, bool, list); ``StateFileDamaged`` else.

    A string holds at most ``MAX_TEXT_CHARS`` characters.
    """
    value = doc.get(key)
    if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
        raise StateFileDamaged(f"{where}: {key} holds {len(value)} characters, too many")
    if value is None or isinstance(value, kind):
        return value
    raise StateFileDamaged(f"{where}: {key} must be a {kind.__name__}, got {type(value).__name__}")


def generation_value(doc: Mapping[str, Any], key: str, where: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GENERATION:
        raise StateFileDamaged(f"{where}: {key} must be an integer from 0 to 2^63-1")
    return value


def _is_boot_id(value: Any) -> bool:
    """A boot id as stored: absent, or a string of at most 128 characters (a UUID is 36)."""
    return value is None or (isinstance(value, str) and len(value) <= 128)


def image_names(value: Any, where: str) -> tuple[str, ...]:
    """A stored list of image references, each bounded; ``StateFileDamaged`` otherwise."""
    if not isinstance(value, list) or len(value) > MAX_SET_IMAGES * 100:
        raise StateFileDamaged(f"{where} must be a list of image names")
    for image in value:
        if not isinstance(image, str) or not 0 < len(image) <= MAX_IMAGE_CHARS:
            raise StateFileDamaged(f"{where} holds {clip(repr(image), 100)}, not an image name")
    return tuple(value)


def _max_or_none(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)
