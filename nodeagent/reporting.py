"""One publisher of what the node is doing: the status file, systemd's STATUS=, the cluster.

The Reconciler reports its syncs here (``SyncReport``), the pre-puller its pull events,
the bundle importer its bundle reports. ``Reporter`` turns them into:

* the status file in the state directory (``nodeagent status`` reads it): the last sync's
  status plus the bundles seen;
* the one-line ``STATUS=`` that ``systemctl status nodeagent`` shows, live while pulls run;
* the cluster status object, through an optional ``ClusterSink`` (cluster mode).

The offline drill's ``OfflineReady`` condition (``offline_checked``) is added to every
status published, and ``on_synced`` tells the drill a sync finished (docs/offline.md).

It is also where the two features meet: a bundle whose sets the pin path has pinned is
marked ``pinned`` here, so neither the importer nor the Reconciler knows the other.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import structlog

from nodeagent.errors import NodeAgentError, is_transient_reason
from nodeagent.fips import CryptoPosture, refusal_message
from nodeagent.ledger import save_repairing
from nodeagent.metrics import NO_METRICS, Metrics
from nodeagent.nodeos import OsImage
from nodeagent.ports import PullEvent, PullStep, StateStore, StatusLine
from nodeagent.progress import ProgressLog, new_blob_bytes
from nodeagent.releases import SiteReadiness, release_rows, site_line
from nodeagent.status import (
    BundleReport,
    Condition,
    MirrorStatus,
    NodeStatus,
    PullProgress,
    ReleaseReport,
    bundle_line,
    conditions_for,
    progress_line,
    status_line,
    waiting_conditions,
)

log = structlog.get_logger(__name__)

MAX_BUNDLE_REPORTS = 10
"""Bundles kept in the status (the most recent)."""
PULL_SAVE_INTERVAL_S = 2.0
"""The status file is rewritten at most this often as pulls end (its ``pulls`` counts)."""


class ClusterSink(Protocol):
    """The cluster status object's writer (``cluster.reporter.StatusReporter``)."""

    def update(self, status: NodeStatus, *, is_final: bool) -> None: ...

    def poke(self) -> None: ...


@dataclass
class PullTally:
    """Live pull counts of the sync in progress."""

    pulling: set[str] = field(default_factory=set)
    pulled: set[str] = field(default_factory=set)
    failed: int = 0
    is_syncing: bool = False
    waiting: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Pulls waiting to retry after a transient failure: ref -> (reason, message)."""
    wall_clock: Callable[[], float] = time.time
    """Unix time, for ``startedAt`` (a date)."""
    monotonic: Callable[[], float] = time.monotonic
    """Seconds that a wall-clock step does not move, for the rate."""
    started_at_s: float | None = None
    """When the sync in progress started (seconds since 1970), for the status file."""
    sizes: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    """Per image to pull, the blobs its pull fetches (digest, compressed size), from the
    manifests disk admission read; empty when none was sized."""
    bytes_done: int = 0
    """Compressed bytes of the images pulled so far (a blob two images share once)."""
    sized_at_s: float | None = None
    """When the pulls were sized (their start), monotonic seconds: the rate counts from it."""
    _counted: set[str] = field(default_factory=set)

    def start(self) -> None:
        self.started_at_s = self.wall_clock()
        self.pulling.clear()
        self.pulled.clear()
        self.waiting.clear()
        self.failed = 0
        self.is_syncing = True
        self.sizes, self.bytes_done, self.sized_at_s = {}, 0, None
        self._counted = set()

    def sized(self, blobs: Mapping[str, Sequence[tuple[str, int]]]) -> None:
        """The pulls about to start, with what each fetches (disk admission's figures)."""
        self.sizes = {ref: tuple(found) for ref, found in blobs.items()}
        self.sized_at_s = self.monotonic()

    def end(self) -> None:
        self.is_syncing = False
        self.pulling.clear()
        self.waiting.clear()

    def waiting_cause(self) -> tuple[str, str] | None:
        """The (reason, message) pulls wait on, the first image's in name order; None if none."""
        return self.waiting[min(self.waiting)] if self.waiting else None

    def count(self, event: PullEvent) -> None:
        if event.step is PullStep.STARTED:
            self.pulling.add(event.ref)
            return
        self.pulling.discard(event.ref)
        if event.step is PullStep.PULLED:
            self.pulled.add(event.ref)
            self.bytes_done += new_blob_bytes(self.sizes.get(event.ref, ()), self._counted)
        elif event.step is PullStep.FAILED:
            self.failed += 1

    def to_json(self, last: NodeStatus | None) -> dict[str, Any] | None:
        """The status file's ``pulls`` while a sync pulls: images done of those it found
        missing, since when, and bytes. The runtime reports no bytes while an image pulls, so
        bytes count whole images: the blobs of each image pulled, of those of every image
        sized (``sized``); the rate is those bytes over the time since the pulls started.
        Unknown (None) without sizes, or before the first image is done: never guessed."""
        missing = sum(len(s.pending) for s in last.sets) if last is not None else 0
        if not self.is_syncing or not (missing or self.pulling or self.pulled or self.failed):
            return None
        started = dt.datetime.fromtimestamp(self.started_at_s or 0.0, dt.UTC)
        if self.sizes:
            total: int | None = new_blob_bytes(
                (blob for blobs in self.sizes.values() for blob in blobs), set()
            )
            done: int | None = self.bytes_done
        else:
            total = (sum(s.bytes_to_pull for s in last.sets) if last is not None else 0) or None
            done = None
        elapsed_s = self.monotonic() - self.sized_at_s if self.sized_at_s is not None else 0.0
        rate = done / elapsed_s if done and elapsed_s > 0 else None
        return {
            "startedAt": started.isoformat(timespec="seconds"),
            "images": {
                "total": missing,
                "done": len(self.pulled),
                "failed": self.failed,
                "inProgress": len(self.pulling),
            },
            "bytes": {"total": total, "done": done},
            "bytesPerSecond": round(rate, 1) if rate is not None else None,
        }

    def snapshot(self) -> PullProgress:
        return PullProgress(
            tuple(sorted(self.pulling)), frozenset(self.pulled), self.failed, self.is_syncing
        )


@dataclass
class BundleBoard:
    """The latest report per bundle source, for the status file."""

    reports: dict[str, BundleReport] = field(default_factory=dict)
    site_readiness: Callable[[str], SiteReadiness | None] = lambda _digest: None
    """How many nodes have pinned the release of this digest, where this node can know it
    (the one-touch starter's NodeImageStatuses); None: it cannot (decision 0073)."""

    def update(self, report: BundleReport) -> None:
        self.reports[report.source] = report
        while len(self.reports) > MAX_BUNDLE_REPORTS:
            self.reports.pop(next(iter(self.reports)))

    def mark_pinned(self, pinned_sets: set[str]) -> None:
        """An imported bundle whose sets are all pinned is done: state ``pinned``."""
        for source, report in list(self.reports.items()):
            if report.state == "imported" and set(report.sets) <= pinned_sets:
                self.reports[source] = replace(report, state="pinned")
                log.info("bundle_pinned", bundle=report.bundle_id, sets=list(report.sets))
                if report.next_steps:  # a release: this node is ready, and the site?
                    steps = self._steps(report)
                    log.info("release_pinned", bundle=report.bundle_id, next=steps[0],
                             site=steps[1], then=" ".join(steps[2:]))  # fmt: skip

    def _steps(self, report: BundleReport) -> list[str]:
        """The release's next steps with the site's readiness second, as of now."""
        digest = report.release.digest if report.release is not None else ""
        site = site_line(self.site_readiness(digest) if digest else None)
        return [report.next_steps[0], site, *report.next_steps[1:]]

    def current(self) -> tuple[BundleReport, ...]:
        """The reports as the status shows them: a pinned release's site readiness as of now."""
        return tuple(
            replace(r, next_steps=tuple(self._steps(r)))
            if r.state == "pinned" and r.next_steps
            else r
            for r in self.reports.values()
        )

    def to_json(self) -> list[dict[str, object]]:
        return [report.to_json() for report in self.current()]


def log_pull(event: PullEvent, *, source: str | None = None) -> None:
    """One pull step in the journal: outcomes at info/error, the start at debug."""
    fields = event.fields() | ({"source": source} if source else {})
    if event.step is PullStep.FAILED:
        log.error(event.step.value, **fields)
    elif event.step is PullStep.STARTED:
        log.debug(event.step.value, **fields)
    else:
        log.info(event.step.value, **fields)


class Reporter:
    """Implements ``sync.SyncReport`` and the pull and bundle sinks; writes every output."""

    def __init__(
        self,
        *,
        line: StatusLine,
        store: StateStore,
        cluster: ClusterSink | None = None,
        tally: PullTally | None = None,
        board: BundleBoard | None = None,
        on_synced: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics = NO_METRICS,
        releases_source: Callable[[], tuple[ReleaseReport, ...]] | None = None,
        boot_id: str = "",
    ) -> None:
        """``clock``: monotonic seconds, for pacing the status file's writes while pulls end.
        ``releases_source``: the releases the node's store holds (``status.releases``).
        ``boot_id``: this boot's, to tell whether the status file on disk is of this boot."""
        self.boot_id = boot_id
        self.line = line
        self.clock = clock
        self.metrics = metrics
        """The metrics endpoint's recorder: each sync's sets, pulls, bundles, offline drill."""
        self.releases_source = releases_source
        self.on_synced = on_synced
        self.offline: Condition | None = None
        """The offline drill's last ``OfflineReady`` condition, added to every status."""
        self.dropin: Condition | None = None
        """The node mirror drop-in's last ``MirrorDropin`` condition, added to every status."""
        self.upgrade_start: Condition | None = None
        """The one-touch starter's last ``UpgradeStart`` condition, added to every status."""
        self.os_image: OsImage | None = None
        """The node's OS image as last read (``nodeos``), added to every status."""
        self.mirror: MirrorStatus | None = None
        """The node mirror as the peer process last reported it, added to every status."""
        self.crypto: CryptoPosture | None = None
        """FIPS mode and Ed25519 as read at start (``fips``), added to every status."""
        self.store = store
        self.cluster = cluster
        self.tally = tally or PullTally()
        self.board = board or BundleBoard()
        self.last: NodeStatus | None = None
        self._saved_s = 0.0
        self.progress_log = ProgressLog()
        """Paces the journal's progress lines of bundle copies, fetches and imports."""
        self._sync_status: NodeStatus | None = None
        """The last status the sync itself made (``last`` may add a waiting cause to it)."""

    # ---------------------------------------------------------------- sync
    def sync_started(self) -> None:
        self.tally.start()

    def sync_progress(self, status: NodeStatus) -> None:
        """The interim status while a sync's pulls run."""
        self.metrics.sets_reported(status.sets, is_final=False)
        self._publish(status, is_final=False)

    def sync_finished(self, status: NodeStatus) -> None:
        self.tally.end()
        self.board.mark_pinned({s.name for s in status.sets if s.state == "Pinned"})
        self.metrics.sets_reported(status.sets, is_final=True)
        self._publish(status, is_final=True)
        if self.on_synced is not None:
            self.on_synced()

    def offline_checked(self, condition: Condition) -> None:
        """The offline drill ran: its condition joins the status (republished if it changed)."""
        self.metrics.offline_checked(condition)
        if condition == self.offline:
            return
        self.offline = condition
        if self.last is None:
            return
        self.save()
        if self.cluster is not None:
            self.cluster.update(self._with_bundles(self.last), is_final=False)

    def releases_changed(self) -> None:
        """The cluster's version changed (``cluster.version_watch``): the releases the store
        holds are judged again and the status republished."""
        if self.last is None:
            return
        said = {(r.digest, r.path_reason) for r in self.last.releases}
        held = self._with_bundles(self.last)
        for release in held.releases:  # judged again: a new verdict is said once
            if release.path_reason and (release.digest, release.path_reason) not in said:
                log.warning(
                    "release_not_an_upgrade", release=release.version, digest=release.digest,
                    cluster_version=release.cluster_version, reason=release.path_reason,
                    error=release.path_message,
                    action="the release stays pinned but will not be proposed as the "
                    "cluster's next version",
                )  # fmt: skip
        self.last = replace(self.last, releases=held.releases)
        self.metrics.releases_reported(release_rows(held))
        if self.cluster is not None:
            self.cluster.update(held, is_final=False)

    def dropin_checked(self, condition: Condition) -> None:
        """The node mirror drop-in was rendered: its condition joins the status (decision
        0058; republished if it changed)."""
        if condition == self.dropin:
            return
        self.dropin = condition
        if self.last is None:
            return
        self.save()
        if self.cluster is not None:
            self.cluster.update(self._with_bundles(self.last), is_final=False)

    def upgrade_start_said(self, condition: Condition) -> None:
        """The one-touch starter decided (``cluster.starting``): whether this node started the
        upgrade and why, or why not yet, joins the status (republished if it changed)."""
        if condition == self.upgrade_start:
            return
        self.upgrade_start = condition
        if self.last is None:
            return
        self.save()
        if self.cluster is not None:
            self.cluster.update(self._with_bundles(self.last), is_final=False)

    def sync_failed(self, error: NodeAgentError) -> None:
        """A sync that could not run: the last sets stay, the error names the cause."""
        self.tally.end()
        last = self.last or NodeStatus(sets=(), conditions=())
        status = replace(
            last,
            conditions=conditions_for(last.sets, 0, (error.reason, error.message)),
            last_error=str(error),
            pulling=0,
            retry_in_s=None,
        )
        self._publish(status, is_final=True)

    def crypto_read(self, posture: CryptoPosture) -> None:
        """The crypto posture was read (once, at start): journal it, add it to the status."""
        log.info(
            "crypto_posture_read",
            host_fips=posture.host_fips,
            backend=posture.backend,
            ed25519=posture.ed25519,
        )
        if posture.reason is not None:
            log.warning("ed25519_refused", reason=posture.reason, error=refusal_message(posture))
        self.crypto = posture
        if self.last is not None:
            self.save()

    def os_image_read(self, image: OsImage) -> None:
        """The node's OS image was read: it joins the status (republished if it changed)."""
        if image == self.os_image:
            return
        booted = image.booted
        log.info(
            "node_os_read",
            os=image.os_id,
            version=image.version_id,
            booted_image=booted.image if booted else None,
            digest=booted.digest if booted else None,
            source=booted.tool if booted else None,
        )
        self.os_image = image
        if self.last is None:
            return
        self.save()
        if self.cluster is not None:
            self.cluster.update(self._with_bundles(self.last), is_final=False)

    def mirror_reported(self, mirror: MirrorStatus) -> None:
        """The node mirror's state changed: it joins the status (republished)."""
        if mirror == self.mirror:
            return
        if self.mirror is None or self.mirror.serving != mirror.serving:
            log.info("node_mirror_reported", serving=mirror.serving, listen=mirror.listen)
        self.mirror = mirror
        if self.last is None:
            return
        self.save()
        if self.cluster is not None:
            self.cluster.update(self._with_bundles(self.last), is_final=False)

    # ---------------------------------------------------------------- pulls
    def pulls_sized(self, blobs: Mapping[str, Sequence[tuple[str, int]]]) -> None:
        """Disk admission sized the pulls it admitted: bytes for the status and the metrics."""
        self.tally.sized(blobs)
        self.metrics.pulls_sized(blobs)

    def pull_event(self, event: PullEvent) -> None:
        """A pull of the sync started or ended: the journal, STATUS= and the cluster follow.

        While pulls wait on a transient cause (the runtime down, the registry failing), the
        status says so: Degraded with that cause, until a pull moves again.
        """
        log_pull(event)
        if event.step in (PullStep.PULLED, PullStep.FAILED):
            is_pulled = event.step is PullStep.PULLED
            self.metrics.pull_ended(event.ref, is_pulled=is_pulled, seconds=event.seconds)
        self.tally.count(event)
        self._follow_waiting(event)
        line = self.progress_line()
        if line is not None:
            self.line.status(line)
        is_outcome = event.step in (PullStep.PULLED, PullStep.FAILED)
        if is_outcome and self.clock() - self._saved_s >= PULL_SAVE_INTERVAL_S:
            self.save()  # the status file's pulls counts, not once per image
        if self.cluster is not None:
            self.cluster.poke()

    def _follow_waiting(self, event: PullEvent) -> None:
        before = self.tally.waiting_cause()
        if event.step is PullStep.RETRYING and is_transient_reason(event.reason):
            self.tally.waiting[event.ref] = (event.reason or "", event.error or "")
        elif event.step is not PullStep.STARTED:  # a retry starting proves nothing yet
            self.tally.waiting.pop(event.ref, None)
        cause = self.tally.waiting_cause()
        base = self._sync_status
        if cause == before or base is None:
            return
        if cause is None:
            log.info("pulls_resumed")
            self._publish(base, is_final=False, is_sync=False)
            return
        reason, message = cause
        waiting = len(self.tally.waiting)
        log.warning("pulls_waiting", reason=reason, error=message, images=waiting)
        text = f"{waiting} pull(s) waiting to retry: {reason}: {message}"
        conditions = waiting_conditions(base.conditions, reason, text)
        self._publish(replace(base, conditions=conditions), is_final=False, is_sync=False)

    def progress_line(self) -> str | None:
        """'pinned 0/190 images, pulling 4, 1 failed' while pulls run (None before any status)."""
        if self.last is None:
            return None
        totals = self.last.image_totals()
        failed = totals["failed"] + self.tally.failed
        return progress_line(totals["pinned"], totals["total"], len(self.tally.pulling), failed)

    # ---------------------------------------------------------------- bundles
    def bundle_report(self, report: BundleReport) -> None:
        """Into the status file; while copying or importing also the STATUS= line (the
        copier sends progress at most every 2 s: one write each, not one per blob)."""
        self.metrics.bundle_reported(report)
        self.board.update(report)
        self._log_progress(report)
        self.save()
        if self.cluster is not None and self.last is not None:
            # written at the cluster's own pacing, not at every report
            self.cluster.update(self._with_bundles(self.last), is_final=False)
        line = bundle_line(report)
        if line is not None:
            self.line.status(line)
        elif report.state in ("imported", "rejected", "interrupted") and self.last is not None:
            self.line.status(status_line(self.last))

    def _log_progress(self, report: BundleReport) -> None:
        """A long copy, fetch or import says where it is in the journal: every 30 s or 5 %,
        whichever is later (``progress.ProgressLog``); the status file has every update."""
        progress = report.progress or {}
        done, total = progress.get("doneBytes"), progress.get("totalBytes")
        if not isinstance(done, int) or not isinstance(total, int) or total <= 0:
            self.progress_log.forget(report.source)
            return
        job = (report.bundle_id, report.state)
        if self.progress_log.is_due(report.source, job, done / total, self.clock()):
            log.info("bundle_progressed", bundle=report.bundle_id or report.source,
                     step=report.state, progress=report.progress_text)  # fmt: skip

    # ---------------------------------------------------------------- output
    def save(self) -> None:
        """Write the status file: the last sync's status plus the bundles seen."""
        last = self.last
        doc = self._with_bundles(last).to_json() if last else self._before_first_sync()
        if last is None and self.board.reports:
            doc["bundles"] = self.board.to_json()
        pulls = self.tally.to_json(last)
        if pulls is not None:
            doc["pulls"] = pulls
        self._saved_s = self.clock()
        try:
            save_repairing(self.store, "status", doc)
        except NodeAgentError as exc:  # a full or read-only state disk must not stop pinning
            log.warning("status_not_saved", reason=exc.reason, error=exc.message)

    def _before_first_sync(self) -> dict[str, Any]:
        """Before this run's first sync (a by-hand import refused before its sync, a daemon
        starting): the status file of this boot keeps its sets and conditions, since only a
        sync changes pins and each sync writes the status; from another boot, or unreadable,
        nothing is claimed."""
        empty: dict[str, Any] = {"conditions": [], "pinnedImageSets": []}
        try:
            kept = self.store.load("status")
        except NodeAgentError:
            return empty
        if not kept or not self.boot_id or kept.get("bootId") != self.boot_id:
            return empty
        return {k: v for k, v in kept.items() if k not in ("bundles", "pulls")}

    def _with_bundles(self, status: NodeStatus) -> NodeStatus:
        """``status`` with the bundles seen, the offline drill's and the drop-in's conditions."""
        for extra in (self.offline, self.dropin, self.upgrade_start):
            if extra is not None:
                kept = tuple(c for c in status.conditions if c.type != extra.type)
                status = replace(status, conditions=(*kept, extra))
        if self.os_image is not None:
            status = replace(status, os_image=self.os_image)
        if self.releases_source is not None:
            status = replace(status, releases=self.releases_source())
        if self.mirror is not None:
            status = replace(status, mirror=self.mirror)
        if self.crypto is not None:
            status = replace(status, crypto=self.crypto)
        if not self.board.reports:
            return status
        return replace(status, bundles=self.board.current())

    def _publish(self, status: NodeStatus, *, is_final: bool, is_sync: bool = True) -> None:
        self.last = status
        if is_sync:
            self._sync_status = status
        self.save()
        self.line.status(status_line(status))
        held = self._with_bundles(status)
        self.metrics.releases_reported(release_rows(held))
        if self.cluster is not None:
            self.cluster.update(held, is_final=is_final)
