"""What nodeagent remembers between runs: the ledger, a typed value kept as a JSON document.

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

``LedgerStore`` at the bottom keeps the ledger and two copies written independently
of it, and rebuilds it when it is damaged: docs/operations.md, "Damaged state".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from nodeagent.errors import HostFileError, StateFileDamaged
from nodeagent.ports import StateStore

log = structlog.get_logger(__name__)

MAX_GENERATION = 2**63 - 1
"""Generations are Kubernetes int64 values."""


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
        images = _typed(doc, "pinnedImages", list, where) or []
        if not all(isinstance(image, str) for image in images):
            raise StateFileDamaged(f"{where}: pinnedImages must be a list of strings")
        return cls(
            desired_generation=_generation(doc, "desiredGeneration", where) or 0,
            current_generation=_generation(doc, "currentGeneration", where),
            last_failed_generation=_generation(doc, "lastFailedGeneration", where),
            last_failed_error=_typed(doc, "lastFailedError", str, where),
            fingerprint=_typed(doc, "fingerprint", str, where),
            is_persistent=_typed(doc, "persistent", bool, where) is True,
            pinned_images=tuple(images),
            source=_typed(doc, "source", str, where),
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
        if not isinstance(sets, dict) or not isinstance(stored_boot, str | None):
            raise StateFileDamaged("the ledger has no 'sets' object (or a 'bootId' not a string)")
        records = {
            str(name): SetRecord.from_json(item, f"ledger entry {str(name)[:100]!r}")
            for name, item in sets.items()
        }
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


def _typed(doc: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    """``doc[key]`` when absent or of ``kind`` (str, bool, list); ``StateFileDamaged`` else."""
    value = doc.get(key)
    if value is None or isinstance(value, kind):
        return value
    raise StateFileDamaged(f"{where}: {key} must be a {kind.__name__}, got {type(value).__name__}")


def _generation(doc: Mapping[str, Any], key: str, where: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GENERATION:
        raise StateFileDamaged(f"{where}: {key} must be an integer from 0 to 2^63-1")
    return value


def _max_or_none(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


# ---------------------------------------------------------------- store
LEDGER = "ledger"
LAST_GOOD = "ledger.last-good"
"""A copy of the ledger, written only after the ledger itself was saved and read back whole."""
BOOT_PINS = "boot-pins"
"""The persistent pins last rendered, written on its own: what ``render-pins --write`` falls
back to at boot when the ledger is damaged (CRI-O is not running yet, nothing to rebuild from)."""
STATUS = "status"
"""The status the node last published: its generations seed a rebuilt ledger."""

Origin = Literal["ledger", "last-good", "rebuilt", "new"]


@dataclass(frozen=True, slots=True)
class Repair:
    """A damaged state file that was set aside (or, read-only, would have been)."""

    file: str
    message: str
    moved_to: str | None = None

    def to_json(self) -> dict[str, str]:
        doc = {"file": self.file, "reason": StateFileDamaged.reason, "message": self.message}
        return doc | ({"movedTo": self.moved_to} if self.moved_to else {})


@dataclass(frozen=True, slots=True)
class LoadedLedger:
    ledger: Ledger
    origin: Origin
    """Where it came from: the ledger itself, its last good copy, seeds from the published
    status only (``rebuilt``), or nothing at all (``new``: a node that never synced)."""
    repairs: tuple[Repair, ...] = ()
    boot_pins: frozenset[str] = frozenset()
    """The last rendered persistent pins (read only when the ledger itself was not usable)."""

    @property
    def is_rebuilt(self) -> bool:
        return self.origin in ("last-good", "rebuilt")

    def remembered_pins(self) -> set[str]:
        """What to pin before anything else: the ledger's pins, plus the boot copy's when the
        ledger had to be rebuilt (pinning an image too many is harmless, one too few is not)."""
        return self.ledger.pinned_images() | set(self.boot_pins)


class LedgerStore:
    """The ledger in a ``StateStore``, with its last good copy and the boot pins.

    ``load`` never fails on a damaged document: with ``is_repairing`` it sets the
    document aside (``StateStore.set_aside``), logs ``state_file_damaged`` with reason
    ``StateFileDamaged``, and rebuilds from the last good copy and the generations of
    the published status; read-only (``render-pins`` before CRI-O starts) it only says
    what it would do. ``save`` writes the ledger, then the last good copy once the
    ledger reads back whole, then the boot pins.
    """

    def __init__(self, store: StateStore, boot_id: str) -> None:
        self.store = store
        self.boot_id = boot_id

    def load(self, *, is_repairing: bool = True) -> LoadedLedger:
        repairs: list[Repair] = []
        primary = self._ledger(LEDGER, repairs, is_repairing=is_repairing)
        status = self._read(STATUS, repairs, is_repairing=is_repairing)  # damaged: set aside
        if primary is not None:
            return LoadedLedger(primary, "ledger", tuple(repairs))
        ledger = self._ledger(LAST_GOOD, repairs, is_repairing=is_repairing)
        origin: Origin = "last-good"
        if ledger is None:
            ledger, origin = Ledger(self.boot_id), "rebuilt"
        seeds = status_seeds(status, self.boot_id)
        for name, seed in seeds.items():
            ledger.seed(name, seed)
        boot_pins = self._boot_pins(repairs, is_repairing=is_repairing)
        if origin == "rebuilt" and not seeds and not boot_pins and not repairs:
            origin = "new"
        loaded = LoadedLedger(ledger, origin, tuple(repairs), frozenset(boot_pins))
        if origin != "new":
            log.warning(
                "ledger_rebuilt",
                origin=origin,
                sets=len(ledger.sets),
                seeded=len(seeds),
                boot_pins=len(boot_pins),
            )
        return loaded

    def save(self, ledger: Ledger) -> None:
        doc = ledger.to_json()
        self.store.save(LEDGER, doc)
        try:
            Ledger.for_boot(self.store.load(LEDGER), self.boot_id)
        except HostFileError as exc:
            log.warning("ledger_unverified", reason=exc.reason, error=exc.message)
        else:
            self.store.save(LAST_GOOD, doc)
        images = sorted(ledger.pinned_images(is_persistent_only=True))
        self.store.save(BOOT_PINS, {"bootId": self.boot_id, "images": images})

    # ---------------------------------------------------------------- reading
    def _read(self, name: str, repairs: list[Repair], *, is_repairing: bool) -> Any:
        try:
            return self.store.load(name)
        except HostFileError as exc:
            self._damaged(name, exc, repairs, is_repairing=is_repairing)
            return None

    def _ledger(self, name: str, repairs: list[Repair], *, is_repairing: bool) -> Ledger | None:
        doc = self._read(name, repairs, is_repairing=is_repairing)
        if doc is None:
            return None
        try:
            return Ledger.for_boot(doc, self.boot_id)
        except StateFileDamaged as exc:
            self._damaged(name, exc, repairs, is_repairing=is_repairing)
            return None

    def _damaged(
        self, name: str, exc: HostFileError, repairs: list[Repair], *, is_repairing: bool
    ) -> None:
        moved_to = None
        if is_repairing:
            try:
                moved_to = self.store.set_aside(name)
            except HostFileError as failed:
                log.warning("state_file_not_moved", file=name, error=failed.message)
        repairs.append(Repair(name, exc.message, moved_to))
        log.warning(
            "state_file_damaged",
            file=name,
            reason=StateFileDamaged.reason,
            error=exc.message,
            moved_to=moved_to,
        )

    def _boot_pins(self, repairs: list[Repair], *, is_repairing: bool) -> set[str]:
        doc = self._read(BOOT_PINS, repairs, is_repairing=is_repairing)
        images = doc.get("images") if isinstance(doc, dict) else None
        if not isinstance(images, list):
            return set()
        return {image for image in images if isinstance(image, str)}


def status_seeds(doc: Any, boot_id: str) -> dict[str, SetRecord]:
    """Per set, the generations, file and persistence a published status names.

    Tolerant: an item of the wrong shape seeds nothing. Transient sets seed only when
    the status was published during this boot (they are forgotten at a reboot).
    """
    items = doc.get("pinnedImageSets") if isinstance(doc, dict) else None
    is_this_boot = isinstance(doc, dict) and doc.get("bootId") == boot_id
    seeds: dict[str, SetRecord] = {}
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        try:
            name = _typed(item, "name", str, "status")
            record = SetRecord(
                desired_generation=_generation(item, "desiredGeneration", "status") or 0,
                current_generation=_generation(item, "currentGeneration", "status"),
                last_failed_generation=_generation(item, "lastFailedGeneration", "status"),
                is_persistent=_typed(item, "persistent", bool, "status") is True,
                source=_typed(item, "source", str, "status"),
            )
        except StateFileDamaged:
            continue
        if name and (record.is_persistent or is_this_boot):
            seeds[name] = record
    return seeds
