"""The pin path's service: specs -> present? -> disk admission -> pulls -> pins -> status.

The order keeps the node consistent at every step: nothing is pulled before
admission, a set is pinned only when all of its images are present, pins are
written last and proven through CRI, and the ledger records a set as pinned
only after that proof. Killed at any point, the next run redoes only what is
missing (images already stored are skipped via the runtime's own store).

``Reconciler.run`` is the sync loop: a sync on every ``request_sync`` (a spec or
drop-in changed, a bundle was imported), a retry with backoff after a sync that
could not run, and a full re-check every ``SyncSchedule.resync_interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from nodeagent.disk import DiskAdmission, ImageLayers
from nodeagent.errors import NodeAgentError, PinsOverridden, RuntimeDoesNotPin, TransientError
from nodeagent.ledger import Ledger
from nodeagent.pins import PinCheck, PinService
from nodeagent.ports import ImageRuntime, StateStore, StoredImage
from nodeagent.prepull import PrePuller, PullResult, shared_layer_leaders
from nodeagent.specs import PinnedImageSet, SpecLoad, set_fingerprint
from nodeagent.status import (
    DiskStatus,
    ImageFailure,
    NodeStatus,
    SetStatus,
    interim_state,
    node_status,
    set_outcome,
    status_line,
    truncate_error,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SyncSchedule:
    """When syncs run besides on a change (the sync loop's timing)."""

    resync_interval_s: float = 600.0
    """Full re-check even without changes: CRI-O may have wiped its store after a crash."""
    retry_initial_s: float = 1.0
    retry_max_s: float = 60.0
    """Backoff of a sync that could not run (the runtime down): doubles up to this."""
    boot_grace_s: float = 60.0
    """At boot CRI-O starts after nodeagent (``Before=crio.service``): until the runtime first
    answered, an unreachable runtime in this window is expected and logged at info, not as the
    catalog's "runtime does not answer" warning a technician would chase."""


class SyncReport(Protocol):
    """Where the Reconciler reports its syncs (``reporting.Reporter``)."""

    def sync_started(self) -> None: ...

    def sync_progress(self, status: NodeStatus) -> None: ...

    def sync_finished(self, status: NodeStatus) -> None: ...

    def sync_failed(self, error: NodeAgentError) -> None: ...


Waiter = Callable[[asyncio.Event, float], Awaitable[None]]
"""Waits until the event is set or the seconds have passed (a virtual clock in tests)."""


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)


def index_names(images: Iterable[StoredImage]) -> dict[str, StoredImage]:
    return {name.lower(): image for image in images for name in image.names()}


def set_refs(s: PinnedImageSet) -> list[str]:
    return [str(ref) for ref in s.images]


@dataclass
class _Pass:
    """Everything one sync learns, threaded through its steps."""

    specs: SpecLoad
    ledger: Ledger
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

    def bytes_present(self, refs: Iterable[str]) -> int:
        return sum(self.stored[r.lower()].size_bytes for r in refs if self.is_present(r))


class Reconciler:
    """Keeps the node's pins equal to its specs: ``boot`` once, then ``run`` (the sync loop)."""

    def __init__(
        self,
        *,
        load_specs: Callable[[], SpecLoad],
        runtime: ImageRuntime,
        pins: PinService,
        puller: PrePuller,
        admission: DiskAdmission,
        store: StateStore,
        boot_id: str,
        report: SyncReport,
        schedule: SyncSchedule | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Waiter = wait_event,
    ) -> None:
        self.load_specs = load_specs
        self.runtime = runtime
        self.pins = pins
        self.puller = puller
        self.admission = admission
        self.store = store
        self.boot_id = boot_id
        self.report = report
        self.schedule = schedule or SyncSchedule()
        self._monotonic = monotonic
        self._wait = wait
        self._kick = asyncio.Event()
        self.has_reached_runtime = False
        """The runtime answered at least once since this daemon started."""

    def _ledger(self) -> Ledger:
        return Ledger.for_boot(self.store.load("ledger"), self.boot_id)

    def remembered_pins(self) -> set[str]:
        """Images pinned by persistent sets, and by transient ones of this boot."""
        return self._ledger().pinned_images()

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

    # ---------------------------------------------------------------- loop
    def request_sync(self) -> None:
        """Something changed (a spec, a drop-in, an imported bundle): sync soon."""
        self._kick.set()

    async def run(self) -> None:
        """Sync on every request; after a failure retry with backoff; re-check periodically."""
        delay_s = self.schedule.retry_initial_s
        booted_at = self._monotonic()
        while True:
            self._kick.clear()
            started = self._monotonic()
            self.report.sync_started()
            try:
                status = await self.sync()
            except NodeAgentError as exc:
                if isinstance(exc, TransientError):
                    is_booting = (
                        started - booted_at < self.schedule.boot_grace_s
                        and not self.has_reached_runtime
                    )
                    _log_postponed(exc, delay_s, is_booting=is_booting)
                    wait_s, delay_s = delay_s, min(delay_s * 2, self.schedule.retry_max_s)
                else:
                    log.error("sync_failed", reason=exc.reason, error=exc.message)
                    wait_s = self.schedule.retry_max_s
                self.report.sync_failed(exc)
                await self._wait(self._kick, wait_s)
                continue
            delay_s = self.schedule.retry_initial_s
            self.report.sync_finished(status)
            log.info(
                "sync_finished",
                seconds=round(self._monotonic() - started, 1),
                status=status_line(status),
            )
            await self._wait(self._kick, self.schedule.resync_interval_s)

    # ---------------------------------------------------------------- sync
    async def sync(self) -> NodeStatus:
        """One reconciliation; the caller reports its status."""
        run = self._start()
        version = await self.runtime.version()
        self.has_reached_runtime = True
        run.runtime = f"{version.runtime_name} {version.runtime_version}"
        run.stored = index_names(await self.runtime.list_images())
        await self._pull_missing(run)
        run.stored = index_names(await self.runtime.list_images())
        await self._pin(run)
        return self._finish(run)

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
            s.name: ledger.observe_spec(
                s.name, set_fingerprint(s), s.generation, is_persistent=s.is_persistent
            )
            for s in specs.sets
        }
        gone = set(ledger.sets) - set(generations)
        released = set(ledger.forget(gone))
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
        stored_refs = [ref for ref in run.stored if "@sha256:" in ref]
        verdict = await self.admission.admit(missing, stored_refs)
        run.disk, run.refused, run.to_pull = verdict.disk, verdict.refused, verdict.to_pull
        run.layers, run.stored_layers = verdict.layers, verdict.stored_layers
        admitted = verdict.admitted
        todo = sorted({ref for name in admitted for ref in missing[name]})
        log.info("pulls_started", images=len(todo), sets=len(admitted))
        self.report.sync_progress(self._interim(run))
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

    # ---------------------------------------------------------------- pins
    def _wanted(self, run: _Pass) -> set[str]:
        wanted: set[str] = set()
        for s in run.specs.sets:
            refs = set_refs(s)
            if all(run.is_present(r) for r in refs):
                wanted.update(refs)
            else:  # keep what this set had pinned until its new generation is complete
                wanted.update(r for r in run.ledger.pinned_of(s.name) if run.is_present(r))
        return wanted

    async def _pin(self, run: _Pass) -> None:
        wanted = self._wanted(run)
        before = run.ledger.pinned_images()
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
            record = run.ledger.entry(s.name)
            pending = run.pending.get(s.name, [])
            state = interim_state(
                is_refused=s.name in run.refused,
                pending=pending,
                current_generation=record.current_generation,
                generation=generation,
            )
            failed_generation = record.last_failed_generation
            failed_error = record.last_failed_error
            if state == "Refused":
                failed_generation, failed_error = generation, run.refused[s.name]
            sets.append(
                SetStatus(
                    name=s.name,
                    source=s.source,
                    is_persistent=s.is_persistent,
                    state=state,
                    desired_generation=generation,
                    current_generation=record.current_generation,
                    last_failed_generation=failed_generation,
                    last_failed_error=failed_error,
                    images_total=len(refs),
                    images_present=len(refs) - len(pending),
                    images_pinned=len(refs) - len(pending) if state == "Pinned" else 0,
                    reason="InsufficientDiskSpace" if state == "Refused" else None,
                    bytes_present=run.bytes_present(refs),
                    bytes_to_pull=run.to_pull.get(s.name, 0),
                    pending=tuple(pending),
                )
            )
        return node_status(sets, runtime=run.runtime, disk=run.disk, updated_at=_now())

    def _finish(self, run: _Pass) -> NodeStatus:
        sets = [self._set_status(run, s) for s in run.specs.sets]
        self.store.save("ledger", run.ledger.to_json())
        problems = [
            {"file": p.source, "set": p.object_name or "", "reason": p.reason, "message": p.message}
            for p in run.specs.problems
        ]
        return node_status(
            sets,
            runtime=run.runtime,
            disk=run.disk,
            problems=problems,
            last_error=run.pin_error.message if run.pin_error else None,
            updated_at=_now(),
        )

    def _set_status(self, run: _Pass, s: PinnedImageSet) -> SetStatus:
        refs = set_refs(s)
        generation = run.generations[s.name]
        present = [r for r in refs if run.is_present(r)]
        not_pinned = set(run.check.not_pinned) if run.check else set(refs)
        pinned = [r for r in present if r not in not_pinned]
        failures = tuple(run.failures[r] for r in refs if r in run.failures)
        pin_error = run.pin_error
        state, reason, error = set_outcome(
            refused_error=run.refused.get(s.name),
            failures=failures,
            pin_error=(pin_error.reason, pin_error.message) if pin_error else None,
            is_all_pinned=len(pinned) == len(refs),
        )
        if state == "Pinned":
            if run.ledger.entry(s.name).current_generation != generation:
                log.info("set_pinned", set=s.name, generation=generation, images=len(refs))
            run.ledger.record_pinned(s.name, generation, refs)
        elif error is not None:
            run.ledger.record_failed(s.name, generation, truncate_error(error))
            log.error("set_failed", set=s.name, generation=generation, reason=reason, error=error)
        record = run.ledger.entry(s.name)
        return SetStatus(
            name=s.name,
            source=s.source,
            is_persistent=s.is_persistent,
            state=state,
            desired_generation=generation,
            current_generation=record.current_generation,
            last_failed_generation=record.last_failed_generation,
            last_failed_error=record.last_failed_error,
            images_total=len(refs),
            images_present=len(present),
            images_pinned=len(pinned),
            failures=failures,
            reason=reason,
            bytes_present=run.bytes_present(refs),
            bytes_to_pull=0 if len(present) == len(refs) else run.to_pull.get(s.name, 0),
        )


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _log_postponed(exc: TransientError, delay_s: float, *, is_booting: bool) -> None:
    """A sync that must wait: a warning, except for the runtime not up yet at boot."""
    if is_booting and exc.reason == "RuntimeUnreachable":
        log.info("runtime_awaited", reason=exc.reason, retry_in_s=round(delay_s))
        return
    log.warning("sync_postponed", reason=exc.reason, error=exc.message, retry_in_s=round(delay_s))
