"""The ledger on disk, with two copies written independently of it, rebuilt when damaged.

``LedgerStore`` keeps ``ledger.json``, ``ledger.last-good.json`` (written only after the
ledger was saved and read back whole) and ``boot-pins.json`` (the persistent pins last
rendered, for ``render-pins --write`` at boot). A damaged document is set aside beside
itself and the ledger rebuilt: docs/operations.md, "Damaged state".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import structlog

from nodeagent.errors import HostFileError, StateFileDamaged
from nodeagent.ledger.records import (
    MAX_SET_NAME_CHARS,
    Ledger,
    SetRecord,
    generation_value,
    image_names,
    typed_value,
)
from nodeagent.ports import StateStore

log = structlog.get_logger(__name__)

LEDGER = "ledger"
LAST_GOOD = "ledger.last-good"
"""A copy of the ledger, written only after the ledger itself was saved and read back whole."""
BOOT_PINS = "boot-pins"
"""The persistent pins last rendered, written on its own: what ``render-pins --write`` falls
back to at boot when the ledger is damaged (CRI-O is not running yet, nothing to rebuild from)."""
STATUS = "status"
"""The status the node last published: its generations seed a rebuilt ledger."""

Origin = Literal["ledger", "last-good", "rebuilt", "new"]


MAX_LATE_REPAIRS = 10
"""The status lists this many of the repairs made while the daemon ran (the newest)."""


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
        self.late_repairs: list[Repair] = []
        """Damage found by ``save`` (the file was damaged while the daemon ran)."""

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
        """Write the ledger (a failure raises: the sync reports it), then its two copies (a
        failure there is logged: the ledger itself is written).

        The file on disk is read first: one damaged while the daemon ran (the daemon works
        from its own copy) is set aside and reported before it is replaced, not lost."""
        doc = ledger.to_json()
        self._ledger(LEDGER, self.late_repairs, is_repairing=True)  # damaged meanwhile: kept
        del self.late_repairs[:-MAX_LATE_REPAIRS]
        save_repairing(self.store, LEDGER, doc)
        try:
            Ledger.for_boot(self.store.load(LEDGER), self.boot_id)
        except HostFileError as exc:
            log.warning("ledger_unverified", reason=exc.reason, error=exc.message)
            return
        images = sorted(ledger.pinned_images(is_persistent_only=True))
        for name, copy in (
            (LAST_GOOD, doc),
            (BOOT_PINS, {"bootId": self.boot_id, "images": images}),
        ):
            try:
                save_repairing(self.store, name, copy)
            except HostFileError as exc:
                log.warning("state_copy_not_saved", file=name, reason=exc.reason, error=exc.message)

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
        if doc is None:
            return set()
        try:
            return set(image_names(doc.get("images"), "the boot pins' images"))
        except StateFileDamaged as exc:
            self._damaged(BOOT_PINS, exc, repairs, is_repairing=is_repairing)
            return set()


def save_repairing(store: StateStore, name: str, doc: dict[str, Any]) -> None:
    """``store.save``; when that fails because the file in the way is damaged (a directory,
    say), set it aside (``state_file_damaged``) and save once more. Other failures (a full
    disk) raise without touching the file."""
    try:
        store.save(name, doc)
    except HostFileError:
        if not _set_aside_if_damaged(store, name):
            raise
        store.save(name, doc)


def _set_aside_if_damaged(store: StateStore, name: str) -> bool:
    try:
        store.load(name)
    except HostFileError as damage:
        moved_to = store.set_aside(name)
        log.warning(
            "state_file_damaged",
            file=name,
            reason=StateFileDamaged.reason,
            error=damage.message,
            moved_to=moved_to,
        )
        return True
    return False


def status_seeds(doc: Any, boot_id: str) -> dict[str, SetRecord]:
    """Per set, the generations, file and persistence a published status names.

    Tolerant: an item of the wrong shape (or a name no set can have) seeds nothing.
    Transient sets seed only when the status was published during this boot (they are
    forgotten at a reboot).
    """
    items = doc.get("pinnedImageSets") if isinstance(doc, dict) else None
    is_this_boot = isinstance(doc, dict) and doc.get("bootId") == boot_id
    seeds: dict[str, SetRecord] = {}
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        try:
            name = typed_value(item, "name", str, "status")
            record = SetRecord(
                desired_generation=generation_value(item, "desiredGeneration", "status") or 0,
                current_generation=generation_value(item, "currentGeneration", "status"),
                last_failed_generation=generation_value(item, "lastFailedGeneration", "status"),
                is_persistent=typed_value(item, "persistent", bool, "status") is True,
                source=typed_value(item, "source", str, "status"),
            )
        except StateFileDamaged:
            continue
        is_name = isinstance(name, str) and 0 < len(name) <= MAX_SET_NAME_CHARS
        if is_name and (record.is_persistent or is_this_boot):
            seeds[name] = record
    return seeds
