"""One reconciliation of the node: specs -> present? -> disk admission -> pulls -> pins -> status.

The order keeps the node consistent at every step: nothing is pulled before
admission, a set is pinned only when all of its images are present, pins are
written last and proven through CRI, and the ledger records a set as pinned
only after that proof. Killed at any point, the next run redoes only what is
missing (images already stored are skipped via the runtime's own store).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from nodeagent import ledger as ledger_mod
from nodeagent.disk import (
    FilesystemSpace,
    ImageLayers,
    SetAdmission,
    admit_sets,
    needed_bytes,
    present_digests,
    reserve_for,
    unique_missing_bytes,
)
from nodeagent.errors import NodeAgentError, PinsOverridden, RuntimeDoesNotPin
from nodeagent.pins import PinCheck, PinService
from nodeagent.ports import ImageRuntime, RegistryCredentials, StoredImage
from nodeagent.prepull import PrePuller, PullResult, shared_layer_leaders
from nodeagent.specs import PinnedImageSet, SpecLoad, set_fingerprint
from nodeagent.status import (
    DiskStatus,
    ImageFailure,
    NodeStatus,
    SetStatus,
    conditions_for,
    truncate_error,
)
from nodeagent.units import format_bytes

log = structlog.get_logger(__name__)

MANIFEST_FETCHES_AT_ONCE = 8
"""Manifest requests in flight during disk admission. Each costs a round trip or two to
the registry: one after another, 50 images 50 ms away took 5 s before the first pull."""


class ManifestSource(Protocol):
    async def image_layers(
        self, ref: str, credentials: RegistryCredentials | None
    ) -> ImageLayers: ...


class SpaceProbe(Protocol):
    def space(self, mountpoint: str) -> FilesystemSpace: ...


class StateStore(Protocol):
    def load(self, name: str) -> dict[str, Any] | None: ...

    def save(self, name: str, obj: dict[str, Any]) -> bool: ...


@dataclass(frozen=True, slots=True)
class DiskPolicy:
    expansion_factor: float = 2.0
    reserve_bytes: int = 2 * 1024**3
    reserve_percent: float = 0.0


def index_names(images: Iterable[StoredImage]) -> dict[str, StoredImage]:
    return {name.lower(): image for image in images for name in image.names()}


def set_refs(s: PinnedImageSet) -> list[str]:
    return [str(ref) for ref in s.images]


@dataclass
class _Pass:
    """Everything one sync learns, threaded through its steps."""

    specs: SpecLoad
    ledger: ledger_mod.Ledger
    generations: dict[str, int]
    released: set[str]
    runtime: str = ""
    stored: dict[str, StoredImage] = field(default_factory=dict)
    failures: dict[str, ImageFailure] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    disk: DiskStatus | None = None
    pin_error: NodeAgentError | None = None
    check: PinCheck | None = None
    pending: dict[str, list[str]] = field(default_factory=dict)
    """Per set, the images missing when the sync started."""
    to_pull: dict[str, int] = field(default_factory=dict)
    """Per set, compressed bytes still to download (from the manifests)."""
    layers: dict[str, ImageLayers] = field(default_factory=dict)
    """Manifests of the images to pull, from admission."""
    stored_layers: set[str] = field(default_factory=set)
    """Layer digests of images the runtime already has."""

    def is_present(self, ref: str) -> bool:
        return ref.lower() in self.stored


class Reconciler:
    """Runs syncs; the daemon calls ``boot`` once, then ``sync`` on every change."""

    def __init__(
        self,
        *,
        load_specs: Callable[[], SpecLoad],
        runtime: ImageRuntime,
        pins: PinService,
        puller: PrePuller,
        manifests: ManifestSource,
        space: SpaceProbe,
        credentials_for: Callable[[str], RegistryCredentials | None],
        store: StateStore,
        boot_id: str,
        disk: DiskPolicy,
        on_status: Callable[[NodeStatus], None] = lambda _s: None,
        on_progress: Callable[[NodeStatus], None] = lambda _s: None,
        on_image_fs: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.load_specs = load_specs
        self.runtime = runtime
        self.pins = pins
        self.puller = puller
        self.manifests = manifests
        self.space = space
        self.credentials_for = credentials_for
        self.store = store
        self.boot_id = boot_id
        self.disk = disk
        self.on_status = on_status
        self.on_progress = on_progress
        self.on_image_fs = on_image_fs
        self._image_fs: str | None = None
        self.has_reached_runtime = False
        """The runtime answered at least once since this daemon started."""

    def _ledger(self) -> ledger_mod.Ledger:
        return ledger_mod.for_boot(self.store.load("ledger"), self.boot_id)

    def remembered_pins(self) -> set[str]:
        """Images pinned by persistent sets, and by transient ones of this boot."""
        return ledger_mod.pinned_images(self._ledger())

    async def boot(self) -> None:
        """Re-render the pins remembered from before, ahead of anything else.

        Only the file is written; the reload it owes (a previous run may have died
        between writing and reloading) is left to the first sync. Before READY=1 a
        reload cannot finish: systemd orders crio.service's reload job after
        nodeagent.service's start job (``Before=crio.service``), which waits for
        nodeagent, so asking now would hang until ``reload_timeout_s``. A runtime
        that is not running yet reads the file when it starts.
        """
        wanted = self.remembered_pins()
        self.pins.owe_reload()
        is_changed, _, _ = await self.pins.write(wanted, is_runtime_running=False)
        log.info("pins_restored", images=len(wanted), is_changed=is_changed, reload="first sync")

    # ---------------------------------------------------------------- sync
    async def sync(self) -> NodeStatus:
        run = self._start()
        version = await self.runtime.version()
        self.has_reached_runtime = True
        run.runtime = f"{version.runtime_name} {version.runtime_version}"
        run.stored = index_names(await self.runtime.list_images())
        await self._pull_missing(run)
        run.stored = index_names(await self.runtime.list_images())
        await self._pin(run)
        status = self._finish(run)
        self.on_status(status)
        return status

    def _start(self) -> _Pass:
        specs = self.load_specs()
        for problem in specs.problems:
            log.warning(
                "spec_rejected",
                file=problem.source,
                set=problem.object_name,
                reason=problem.reason,
                error=problem.message,
            )
        ledger = self._ledger()
        generations = {
            s.name: ledger_mod.observe_spec(
                ledger, s.name, set_fingerprint(s), s.generation, is_persistent=s.is_persistent
            )
            for s in specs.sets
        }
        gone = set(ledger["sets"]) - set(generations)
        released = set(ledger_mod.forget(ledger, gone))
        for name in sorted(gone):
            log.info("set_removed", set=name)
        return _Pass(specs, ledger, generations, released)

    async def _pull_missing(self, run: _Pass) -> None:
        missing = {
            s.name: [r for r in set_refs(s) if not run.is_present(r)] for s in run.specs.sets
        }
        missing = {name: refs for name, refs in missing.items() if refs}
        run.pending = missing
        if not missing:
            return
        admitted = await self._admit(run, missing)
        todo = sorted({ref for name in admitted for ref in missing[name]})
        log.info("pulls_started", images=len(todo), sets=len(admitted))
        self.on_progress(self._interim(run))
        results = await self.puller.pull_all(todo, self._waits(run, todo))
        self._record_pulls(run, results.values())

    def _waits(self, run: _Pass, todo: Sequence[str]) -> dict[str, frozenset[str]]:
        layers = {ref: run.layers[ref].layers for ref in todo if ref in run.layers}
        min_bytes = self.puller.policy.shared_layer_min_bytes
        return shared_layer_leaders(todo, layers, run.stored_layers, min_bytes)

    def _record_pulls(self, run: _Pass, results: Iterable[PullResult]) -> None:
        for result in results:
            if not result.is_pulled:
                run.failures[result.ref] = ImageFailure(
                    result.ref, result.reason or "Unknown", result.message or ""
                )

    async def _admit(self, run: _Pass, missing: Mapping[str, Sequence[str]]) -> list[str]:
        layers = await self._layers({r for refs in missing.values() for r in refs}, run)
        have = await self._layers({k for k in run.stored if "@sha256:" in k}, None)
        filesystems = await self.runtime.image_fs_info()
        mountpoint = filesystems[0].mountpoint if filesystems else "/"
        if mountpoint != self._image_fs:
            self._image_fs = mountpoint
            self.on_image_fs(mountpoint)
        space = await asyncio.to_thread(self.space.space, mountpoint)
        reserve = reserve_for(space.total_bytes, self.disk.reserve_bytes, self.disk.reserve_percent)
        by_set = {name: [layers[r] for r in refs if r in layers] for name, refs in missing.items()}
        stored = present_digests(have.values())
        run.to_pull = {
            name: unique_missing_bytes(images, stored) for name, images in by_set.items()
        }
        run.layers, run.stored_layers = layers, stored
        verdict = admit_sets(by_set, stored, space, reserve, self.disk.expansion_factor)
        self._record_admission(run, verdict, space, reserve, by_set, stored=stored)
        return list(verdict.admitted)

    def _record_admission(
        self,
        run: _Pass,
        verdict: SetAdmission,
        space: FilesystemSpace,
        reserve: int,
        by_set: Mapping[str, Sequence[ImageLayers]],
        *,
        stored: set[str],
    ) -> None:
        claimed = [image for name in verdict.admitted for image in by_set[name]]
        need = needed_bytes(unique_missing_bytes(claimed, stored), self.disk.expansion_factor)
        run.disk = DiskStatus(space.mountpoint, space.available_bytes, need, reserve)
        if verdict.refused:
            message = verdict.total.describe()
            log.error(
                "disk_refused",
                sets=list(verdict.refused),
                error=message,
                needed_bytes=verdict.total.needed_bytes,
                available_bytes=space.available_bytes,
                reserve_bytes=reserve,
            )
            run.refused = dict.fromkeys(verdict.refused, message)
        else:
            log.info(
                "disk_admitted",
                needed=format_bytes(need),
                available=format_bytes(space.available_bytes),
                reserve=format_bytes(reserve),
                needed_bytes=need,
            )

    async def _layers(self, refs: Iterable[str], run: _Pass | None) -> dict[str, ImageLayers]:
        """Manifest sizes per ref; failures are recorded against the image when ``run`` is given."""
        slots = asyncio.Semaphore(MANIFEST_FETCHES_AT_ONCE)

        async def fetch(ref: str) -> ImageLayers | None:
            async with slots:
                try:
                    return await self.manifests.image_layers(ref, self.credentials_for(ref))
                except NodeAgentError as exc:
                    if run is not None:
                        log.warning(
                            "manifest_unavailable", image=ref, reason=exc.reason, error=exc.message
                        )
                    return None

        ordered = sorted(refs)
        fetched = await asyncio.gather(*(fetch(ref) for ref in ordered))
        pairs = zip(ordered, fetched, strict=True)
        return {ref: found for ref, found in pairs if found is not None}

    # ---------------------------------------------------------------- pins
    def _wanted(self, run: _Pass) -> set[str]:
        wanted: set[str] = set()
        for s in run.specs.sets:
            refs = set_refs(s)
            if all(run.is_present(r) for r in refs):
                wanted.update(refs)
            else:  # keep what this set had pinned until its new generation is complete
                kept = ledger_mod.pinned_of(run.ledger, s.name)
                wanted.update(r for r in kept if run.is_present(r))
        return wanted

    async def _pin(self, run: _Pass) -> None:
        wanted = self._wanted(run)
        before = ledger_mod.pinned_images(run.ledger)
        released = (run.released | before) - wanted
        try:
            outcome = await self.pins.apply(wanted, released)
        except (PinsOverridden, RuntimeDoesNotPin) as exc:
            log.error("pins_not_effective", reason=exc.reason, error=exc.message)
            run.pin_error = exc
            return
        run.check = outcome.check
        for ref in released:
            log.info("image_unpinned", image=ref)

    # ---------------------------------------------------------------- status
    def _interim(self, run: _Pass) -> NodeStatus:
        """The status while pulls run: per set what is present, pending and refused."""
        sets = []
        for s in run.specs.sets:
            refs = set_refs(s)
            generation = run.generations[s.name]
            item = ledger_mod.entry(run.ledger, s.name)
            pending = run.pending.get(s.name, [])
            state: Any = "Progressing"
            failed_generation = item.get("lastFailedGeneration")
            failed_error = item.get("lastFailedError")
            if s.name in run.refused:
                state = "Refused"
                failed_generation, failed_error = generation, run.refused[s.name]
            elif not pending and item.get("currentGeneration") == generation:
                state = "Pinned"
            sets.append(
                SetStatus(
                    name=s.name,
                    source=s.source,
                    is_persistent=s.is_persistent,
                    state=state,
                    desired_generation=generation,
                    current_generation=item.get("currentGeneration"),
                    last_failed_generation=failed_generation,
                    last_failed_error=failed_error,
                    images_total=len(refs),
                    images_present=len(refs) - len(pending),
                    images_pinned=len(refs) - len(pending) if state == "Pinned" else 0,
                    reason="InsufficientDiskSpace" if state == "Refused" else None,
                    bytes_present=self._bytes_present(run, refs),
                    bytes_to_pull=run.to_pull.get(s.name, 0),
                    pending=tuple(pending),
                )
            )
        return NodeStatus(
            sets=tuple(sets),
            conditions=conditions_for(sets, len(run.specs.problems), None),
            runtime=run.runtime,
            disk=run.disk,
            updated_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )

    @staticmethod
    def _bytes_present(run: _Pass, refs: Iterable[str]) -> int:
        return sum(run.stored[r.lower()].size_bytes for r in refs if run.is_present(r))

    def _finish(self, run: _Pass) -> NodeStatus:
        sets = tuple(self._set_status(run, s) for s in run.specs.sets)
        self.store.save("ledger", run.ledger)
        problems = tuple(
            {"file": p.source, "set": p.object_name or "", "reason": p.reason, "message": p.message}
            for p in run.specs.problems
        )
        return NodeStatus(
            sets=sets,
            conditions=conditions_for(sets, len(problems), None),
            runtime=run.runtime,
            disk=run.disk,
            problems=problems,
            last_error=run.pin_error.message if run.pin_error else None,
            updated_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )

    def _set_status(self, run: _Pass, s: PinnedImageSet) -> SetStatus:
        refs = set_refs(s)
        generation = run.generations[s.name]
        present = [r for r in refs if run.is_present(r)]
        not_pinned = set(run.check.not_pinned) if run.check else set(refs)
        pinned = [r for r in present if r not in not_pinned]
        failures = tuple(run.failures[r] for r in refs if r in run.failures)
        state, reason, error = self._set_state(run, s, len(pinned) == len(refs), failures)
        if state == "Pinned":
            if ledger_mod.entry(run.ledger, s.name).get("currentGeneration") != generation:
                log.info("set_pinned", set=s.name, generation=generation, images=len(refs))
            ledger_mod.record_pinned(run.ledger, s.name, generation, refs)
        elif error is not None:
            ledger_mod.record_failed(run.ledger, s.name, generation, truncate_error(error))
            log.error("set_failed", set=s.name, generation=generation, reason=reason, error=error)
        item = ledger_mod.entry(run.ledger, s.name)
        return SetStatus(
            name=s.name,
            source=s.source,
            is_persistent=s.is_persistent,
            state=state,
            desired_generation=generation,
            current_generation=item.get("currentGeneration"),
            last_failed_generation=item.get("lastFailedGeneration"),
            last_failed_error=item.get("lastFailedError"),
            images_total=len(refs),
            images_present=len(present),
            images_pinned=len(pinned),
            failures=failures,
            reason=reason,
            bytes_present=self._bytes_present(run, refs),
            bytes_to_pull=0 if len(present) == len(refs) else run.to_pull.get(s.name, 0),
        )

    def _set_state(
        self, run: _Pass, s: PinnedImageSet, is_all_pinned: bool, failures: Sequence[ImageFailure]
    ) -> tuple[Any, str | None, str | None]:
        if s.name in run.refused:
            return "Refused", "InsufficientDiskSpace", run.refused[s.name]
        if failures:
            first = failures[0]
            text = (
                f"{len(failures)} image(s) failed; "
                f"first {first.ref}: {first.reason}: {first.message}"
            )
            return "Degraded", first.reason, text
        if run.pin_error is not None:
            return "Degraded", run.pin_error.reason, run.pin_error.message
        if is_all_pinned:
            return "Pinned", None, None
        return "Progressing", None, None
