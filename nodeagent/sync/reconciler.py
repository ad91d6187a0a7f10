"""The Reconciler: ``boot`` once, then ``run`` (the sync loop) of ``sync`` passes.

The order keeps the node consistent at every step: nothing is pulled before
admission, a set is pinned only when all of its images are present, pins are
written last and proven through CRI, and the ledger records a set as pinned
only after that proof. Killed at any point, the next run redoes only what is
missing (images already stored are skipped via the runtime's own store).

State that can be rebuilt is rebuilt: the ledger is loaded once through
``ledger.LedgerStore``, which sets a damaged file aside and falls back to its last
good copy, the published status's generations and the boot pins; the first sync
after such a rebuild also adopts what the runtime reports pinned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

import structlog

from nodeagent.disk import MANIFEST_FETCHES_AT_ONCE, DiskAdmission
from nodeagent.errors import NodeAgentError, PinsOverridden, RuntimeDoesNotPin, TransientError
from nodeagent.ledger import Ledger, LedgerStore, LoadedLedger
from nodeagent.pins import PinService
from nodeagent.ports import ImageRuntime, PullTerms, StateStore
from nodeagent.prepull import PrePuller, PullResult, pulls_in_flight, shared_layer_leaders
from nodeagent.specs import SpecLoad, set_fingerprint
from nodeagent.status import (
    DiskStatus,
    ImageFailure,
    NodeStatus,
    SetStatus,
    node_status,
    status_line,
)
from nodeagent.sync.copies import RegistryStore, admitted_only, log_outcome, registry_wants
from nodeagent.sync.loop import (
    Backoff,
    SyncReport,
    SyncSchedule,
    Waiter,
    log_postponed,
    transient_cause,
    wait_event,
)
from nodeagent.sync.losses import ImageLoss, ImageRestorer, find_loss, is_new, restored_count
from nodeagent.sync.passes import (
    SyncPass,
    final_set,
    held_set,
    index_names,
    interim_set,
    now_text,
    set_refs,
    unsized_failures,
    wanted_pins,
)

log = structlog.get_logger(__name__)


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
        restorer: ImageRestorer | None = None,
        registry_store: RegistryStore | None = None,
        pull_terms: Callable[[], PullTerms] | None = None,
    ) -> None:
        self.load_specs = load_specs
        """Reads every spec file; run in a worker thread (big files must not stall the loop)."""
        self.runtime = runtime
        self.pins = pins
        self.puller = puller
        self.admission = admission
        self.ledgers = LedgerStore(store, boot_id)
        self.boot_id = boot_id
        self.report = report
        self.schedule = schedule or SyncSchedule()
        self._monotonic = monotonic
        self._wait = wait
        self._kick = asyncio.Event()
        self.has_reached_runtime = False
        """The runtime answered at least once since this daemon started."""
        self._loaded: LoadedLedger | None = None
        self._ledger_now: Ledger | None = None
        """The ledger as last loaded or saved (each sync works on a copy)."""
        self._is_adopting = False
        """The ledger was rebuilt: the next sync adopts what the runtime reports pinned."""
        self.restorer = restorer
        self.registry_store = registry_store
        """``[store] registry_sets``: registry sets go through the store (``sync.copies``)."""
        self.pull_terms = pull_terms or PullTerms
        """Cluster mode: whether registry pulls may start, and their pace (``PullTerms``)."""
        self._loss: ImageLoss | None = None
        """The last time pinned images were found missing (reported once, kept in the status
        once they are back, marked resolved)."""

    # ---------------------------------------------------------------- ledger
    def _load(self) -> LoadedLedger:
        if self._loaded is None:
            self._loaded = self.ledgers.load()
            self._ledger_now = self._loaded.ledger
            self._is_adopting = self._loaded.is_rebuilt
        return self._loaded

    def _ledger(self) -> Ledger:
        """A copy of the current ledger for one sync (saved, it becomes the current one)."""
        current = self._ledger_now or self._load().ledger
        return Ledger.for_boot(current.to_json(), self.boot_id)

    def pinned_sets(self) -> set[str]:
        """Names of the sets that pin images now (the store keeps the bundles they came in)."""
        ledger = self._ledger_now or self._load().ledger
        return {name for name, record in ledger.sets.items() if record.pinned_images}

    def remembered_pins(self) -> set[str]:
        """Images pinned by persistent sets, and by transient ones of this boot."""
        return self._load().remembered_pins()

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
        """Sync on every request; retry failures on their own schedule; re-check periodically."""
        schedule = self.schedule
        failed = Backoff(schedule.retry_initial_s, schedule.retry_max_s)
        transient = Backoff(schedule.transient_retry_initial_s, schedule.transient_retry_max_s)
        booted_at = self._monotonic()
        while True:
            self._kick.clear()
            started = self._monotonic()
            self.report.sync_started()
            try:
                status = await self.sync()
            except NodeAgentError as exc:
                failed_wait_s = self._failed(exc, failed, since_boot_s=started - booted_at)
                self.report.sync_failed(exc)
                await self._wait(self._kick, failed_wait_s)
                continue
            failed.reset()
            retry_s = self._next_wait(status, transient)
            self.report.sync_finished(replace(status, retry_in_s=retry_s))
            log.info(
                "sync_finished",
                seconds=round(self._monotonic() - started, 1),
                status=status_line(status),
            )
            await self._wait(self._kick, schedule.resync_interval_s if retry_s is None else retry_s)

    def _failed(self, exc: NodeAgentError, backoff: Backoff, *, since_boot_s: float) -> float:
        """The wait after a sync that could not run: backoff if transient, a minute if not."""
        if not isinstance(exc, TransientError):
            log.error("sync_failed", reason=exc.reason, error=exc.message)
            return self.schedule.retry_max_s
        wait_s = backoff.next()
        booting = since_boot_s < self.schedule.boot_grace_s and not self.has_reached_runtime
        log_postponed(exc, wait_s, is_booting=booting)
        return wait_s

    def _next_wait(self, status: NodeStatus, backoff: Backoff) -> float | None:
        """Seconds to the retry a transient failure calls for; None: wait for the resync."""
        cause = transient_cause(status)
        if cause is None:
            backoff.reset()
            return None
        reason, message, sets = cause
        wait_s = backoff.next()
        log.warning(
            "sync_retry_scheduled", reason=reason, error=message, sets=sets, retry_in_s=wait_s
        )
        return wait_s

    # ---------------------------------------------------------------- sync
    async def sync(self) -> NodeStatus:
        """One reconciliation; the caller reports its status."""
        run = await self._start()
        version = await self.runtime.version()
        self.has_reached_runtime = True
        run.runtime = f"{version.runtime_name} {version.runtime_version}"
        images = await self.runtime.list_images()
        run.stored = index_names(images)
        if self._is_adopting:
            self._adopt(run)
        else:
            self._note_loss(run, len(images))
        await self._restore(run)
        await self._pull_missing(run)
        run.stored = index_names(await self.runtime.list_images())
        await self._pin(run)
        return await self._finish(run)

    async def _start(self) -> SyncPass:
        specs = await asyncio.to_thread(self.load_specs)
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
                s.name,
                set_fingerprint(s),
                s.generation,
                is_persistent=s.is_persistent,
                source=s.source,
            )
            for s in specs.sets
        }
        held = ledger.held(generations, (p.source for p in specs.problems))
        gone = set(ledger.sets) - set(generations) - set(held)
        released = set(ledger.forget(gone))
        for name in sorted(gone):
            log.info("set_removed", set=name)
        return SyncPass(specs, ledger, generations, released, held)

    def _adopt(self, run: SyncPass) -> None:
        """After a rebuild: a set's pinned images are those of its images the runtime reports
        pinned; a held set the rebuild knows no images of keeps the unclaimed boot pins."""
        claimed: set[str] = set()
        for s in run.specs.sets:
            record = run.ledger.entry(s.name)
            refs = set_refs(s)
            claimed.update(refs)
            if not record.pinned_images:
                pinned = [r for r in refs if run.is_present(r) and run.stored[r.lower()].is_pinned]
                record.pinned_images = tuple(sorted(pinned))
        orphans = tuple(sorted(set(self._load().boot_pins) - claimed))
        for name in run.held:
            record = run.ledger.entry(name)
            if not record.pinned_images:
                record.pinned_images = orphans
        log.info("ledger_adopted_runtime_pins", sets=len(run.specs.sets), held=len(run.held))

    def _note_loss(self, run: SyncPass, runtime_images: int) -> None:
        loss = find_loss(run.ledger.pinned_images(), run.stored, runtime_images, now_text())
        previous = self._loss
        if loss is None:
            if previous is not None and not previous.is_resolved:
                log.info("pinned_images_back", images=len(previous.lost), reason=previous.reason)
                self._loss = replace(previous, is_resolved=True)
            return
        if is_new(loss, previous):
            log.warning(
                "pinned_images_lost",
                reason=loss.reason,
                images=len(loss.lost),
                pinned=loss.pinned,
                error=loss.message,
            )
            self._loss = loss

    async def _restore(self, run: SyncPass) -> None:
        """Missing images the local store holds come back from it first, with no network."""
        if self.restorer is None:
            return
        missing = sorted({r for s in run.specs.sets for r in set_refs(s) if not run.is_present(r)})
        held = await self.restorer.holds(missing) if missing else []
        if not held:
            return
        log.info("restore_started", images=len(held), source="local store")
        results = await self.restorer.restore(held)
        restored = [ref for ref, result in results.items() if result.is_pulled]
        run.stored = index_names(await self.runtime.list_images())
        if self._loss is not None:
            count = restored_count(self._loss, {ref: True for ref in restored})
            self._loss = replace(self._loss, restored_from_store=count)
        failed = [r for r in results.values() if not r.is_pulled]
        log.info(
            "images_restored_from_store",
            images=len(restored),
            failed=len(failed),
            message=f"restored {len(restored)} images from the local store",
        )
        _log_restore_failed(failed)

    async def _through_store(
        self, run: SyncPass, todo: list[str], disk: DiskStatus | None, admitted: Sequence[str] = ()
    ) -> list[str]:
        """``[store] registry_sets``: admitted registry images are fetched into the store once
        and pulled from there; what is left (a failure, said once per sync) goes to the
        registry pull. Every sync also hands the store each set's images and pins (its
        records follow them). Returns the images still to pull."""
        if self.registry_store is None or self.restorer is None:
            return todo
        pinned = {name: record.pinned_images for name, record in run.ledger.sets.items()}
        sets = registry_wants(((s.name, set_refs(s)) for s in run.specs.sets), pinned, todo)
        outcome = await self.registry_store.store(admitted_only(sets, admitted), disk)
        stored = log_outcome(outcome, todo)
        if not stored:
            return todo
        results = await self.restorer.restore(stored)
        _log_restore_failed(r for r in results.values() if not r.is_pulled)
        return [ref for ref in todo if not (ref in results and results[ref].is_pulled)]

    async def _pull_missing(self, run: SyncPass) -> None:
        missing = {
            s.name: [r for r in set_refs(s) if not run.is_present(r)] for s in run.specs.sets
        }
        missing = {name: refs for name, refs in missing.items() if refs}
        run.pending = missing
        if not missing:
            await self._through_store(run, [], None)
            return
        stored_refs = [ref for ref in run.stored if "@sha256:" in ref]
        started_s = self._monotonic()
        verdict = await self.admission.admit(missing, stored_refs)
        in_flight = pulls_in_flight(
            self.puller.policy.concurrency,
            manifest_round_s(missing, self._monotonic() - started_s),
        )
        run.disk, run.refused, run.to_pull = verdict.disk, verdict.refused, verdict.to_pull
        run.layers, run.stored_layers = verdict.layers, verdict.stored_layers
        run.unsized = verdict.unsized
        for name in verdict.unsized:
            unsized_failures(run, missing[name], verdict.unknown)
        admitted = verdict.admitted
        todo = sorted({ref for name in admitted for ref in missing[name]})
        log.info("pulls_started", images=len(todo), sets=len(admitted), in_flight=in_flight)
        self.report.sync_progress(self._interim(run))
        terms = self.pull_terms()
        if terms.held_reason and todo:
            self._hold_pulls(run, todo, terms)
            return
        todo = await self._through_store(run, todo, verdict.disk, admitted)
        results = await self.puller.pull_all(
            todo,
            self._waits(run, todo),
            concurrency=1 if terms.one_at_a_time else in_flight,
            pause_s=terms.pause_s if terms.one_at_a_time else 0.0,
        )
        self._record_pulls(run, results.values())

    def _hold_pulls(self, run: SyncPass, todo: Sequence[str], terms: PullTerms) -> None:
        """The Node is not fit for registry pulls: none starts; each image says why (a
        transient reason, so the sync is retried, and again as soon as the Node changes)."""
        log.warning(
            "registry_pulls_waiting",
            reason=terms.held_reason,
            error=terms.held_message,
            images=len(todo),
        )
        for ref in todo:
            run.failures[ref] = ImageFailure(ref, terms.held_reason, terms.held_message)

    def _waits(self, run: SyncPass, todo: Sequence[str]) -> dict[str, frozenset[str]]:
        layers = {ref: run.layers[ref].layers for ref in todo if ref in run.layers}
        min_bytes = self.puller.policy.shared_layer_min_bytes
        return shared_layer_leaders(todo, layers, run.stored_layers, min_bytes)

    def _record_pulls(self, run: SyncPass, results: Iterable[PullResult]) -> None:
        for result in results:
            if not result.is_pulled:
                run.failures[result.ref] = ImageFailure(
                    result.ref, result.reason or "Unknown", result.message or ""
                )

    # ---------------------------------------------------------------- pins
    async def _pin(self, run: SyncPass) -> None:
        wanted = wanted_pins(run)
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
    def _interim(self, run: SyncPass) -> NodeStatus:
        """The status while pulls run: per set what is present, pending and refused."""
        sets = [interim_set(run, s) for s in run.specs.sets]
        sets += [held_set(run, name, is_final=False) for name in sorted(run.held)]
        return self._node_status(run, sets)

    async def _finish(self, run: SyncPass) -> NodeStatus:
        sets = [final_set(run, s) for s in run.specs.sets]
        sets += [held_set(run, name, is_final=True) for name in sorted(run.held)]
        await asyncio.to_thread(self.ledgers.save, run.ledger)  # MBs and fsyncs: off the loop
        self._ledger_now = run.ledger
        self._is_adopting = False
        return self._node_status(run, sets)

    def _node_status(self, run: SyncPass, sets: Sequence[SetStatus]) -> NodeStatus:
        loaded = self._load()
        return node_status(
            sets,
            runtime=run.runtime,
            disk=run.disk,
            problems=run.problems_json(),
            last_error=run.pin_error.message if run.pin_error else None,
            updated_at=now_text(),
            repairs=[r.to_json() for r in (*loaded.repairs, *self.ledgers.late_repairs)],
            boot_id=self.boot_id,
            image_loss=None if self._loss is None else self._loss.to_json(),
        )


def _log_restore_failed(failed: Iterable[PullResult]) -> None:
    """Each image the store could not restore; its registry is tried next."""
    for result in failed:
        log.warning(
            "restore_failed",
            image=result.ref,
            reason=result.reason,
            error=result.message,
            next="the image's registry",
        )


def manifest_round_s(missing: Mapping[str, Sequence[str]], admission_s: float) -> float | None:
    """The seconds a round of the admission's manifest fetches took on average (its time over
    its rounds of ``MANIFEST_FETCHES_AT_ONCE``); None when it fetched none."""
    fetched = len({ref for refs in missing.values() for ref in refs})
    rounds = -(-fetched // MANIFEST_FETCHES_AT_ONCE)
    return admission_s / rounds if rounds else None
