"""The in-memory ``Recorder``: the ``Metrics`` port when ``[metrics] enabled`` (the endpoint
reads its ``snapshot``). Loaded only then (``nodeagent.daemon.wiring``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Concatenate, Final, ParamSpec

from nodeagent.metrics.series import (
    MAX_RELEASE_LABELS,
    Histogram,
    Snapshot,
    Transfer,
    Work,
    counted,
    new_blob_bytes,
    set_rows,
)
from nodeagent.releases import ReleaseRow
from nodeagent.status import BundleReport, Condition, MirrorStatus, SetStatus

BUNDLE_OUTCOMES: Final = frozenset({"imported", "rejected", "interrupted"})
"""Bundle states that end an import (counted once per bundle and outcome)."""
ADMITTED: Final = "Admitted"
P = ParamSpec("P")
"""The reason label of an admitted set (refused and held sets carry their reason code)."""


def _locked(
    method: Callable[Concatenate[Recorder, P], None],
) -> Callable[Concatenate[Recorder, P], None]:
    """Runs a report under the recorder's lock: its read, compute and swap are one step."""

    def locked(self: Recorder, /, *args: P.args, **kwargs: P.kwargs) -> None:
        with self._lock:
            method(self, *args, **kwargs)

    locked.__doc__ = method.__doc__
    return locked


class Recorder:
    """Metrics on: keeps every figure in memory; ``snapshot`` is what a scrape exports.

    Reports come from the event loop and from worker threads (a corrupt blob found while
    serving a peer), ``snapshot`` from the endpoint's thread: each report holds the
    recorder's own lock while it computes the next snapshot (arithmetic on small dicts;
    no await, no I/O), so a scrape never waits on anything a sync holds.
    """

    def __init__(
        self,
        *,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self._lock = threading.RLock()
        self._now = Snapshot()
        self._pull_blobs: dict[str, Sequence[tuple[str, int]]] = {}
        """Blobs of each image admission sized for the pulls in flight (never a label)."""
        self._counted_blobs: set[str] = set()
        """Digests already counted as pulled since the last admission."""
        self._bundle_started: dict[str, float] = {}
        """Per bundle source in flight, when it was first reported (monotonic seconds)."""

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._now

    def _update(self, **changes: object) -> None:
        with self._lock:
            self._now = replace(self._now, **changes)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- syncs and sets
    def sets_reported(self, sets: Sequence[SetStatus], *, is_final: bool) -> None:
        changes: dict[str, object] = {"sets": set_rows(sets), "sets_reported": True}
        if is_final:
            changes["last_sync_unix_s"] = self._wall_clock()
        self._update(**changes)

    # ---------------------------------------------------------------- pulls
    @_locked
    def pulls_sized(self, blobs: Mapping[str, Sequence[tuple[str, int]]]) -> None:
        self._pull_blobs = dict(blobs)
        self._counted_blobs = set()

    @_locked
    def pull_ended(self, ref: str, *, is_pulled: bool, seconds: float | None) -> None:
        now = self.snapshot()
        changes: dict[str, object] = {}
        if seconds is not None:
            changes["durations"] = _observed(now.durations, Work.PULL, seconds)
        blobs = self._pull_blobs.pop(ref, None)
        if is_pulled and blobs is not None:
            size = new_blob_bytes(blobs, self._counted_blobs)
            changes["transferred_bytes"] = _added(now.transferred_bytes, Transfer.PULLED, size)
        if changes:
            self._update(**changes)

    # ---------------------------------------------------------------- disk admission
    @_locked
    def admission_decided(
        self, admitted: Sequence[str], refused: Sequence[str], held: Sequence[str]
    ) -> None:
        decisions = [
            *((("admitted", ADMITTED)) for _ in admitted),
            *((("refused", "InsufficientDiskSpace")) for _ in refused),
            *((("held", "SizeUnknown")) for _ in held),
        ]
        counts, dropped = self._counted(self.snapshot().admissions, decisions)
        self._update(
            admissions=counts,
            refused_sets=len(refused),
            labels_dropped=self.snapshot().labels_dropped + dropped,
        )

    # ---------------------------------------------------------------- bundles
    @_locked
    def bundle_reported(self, report: BundleReport) -> None:
        started = self._bundle_started.setdefault(report.source, self._monotonic())
        if report.state not in BUNDLE_OUTCOMES:
            return
        del self._bundle_started[report.source]
        now = self.snapshot()
        outcome = (
            report.state,
            report.reason or ("Imported" if report.state == "imported" else ""),
        )
        counts, dropped = self._counted(now.bundles, [outcome])
        changes: dict[str, object] = {
            "bundles": counts,
            "labels_dropped": now.labels_dropped + dropped,
        }
        if report.state == "imported" and not report.is_already_imported:
            seconds = self._monotonic() - started
            changes["durations"] = _observed(now.durations, Work.IMPORT, seconds)
            changes["transferred_bytes"] = _added(
                now.transferred_bytes, Transfer.IMPORTED, report.bytes_total
            )
        self._update(**changes)

    # ---------------------------------------------------------------- store, restores, peers
    @_locked
    def restore_ended(self, *, seconds: float) -> None:
        self._update(durations=_observed(self.snapshot().durations, Work.RESTORE, seconds))

    @_locked
    def transferred(self, kind: Transfer, size_bytes: int) -> None:
        if size_bytes > 0:
            now = self.snapshot()
            self._update(transferred_bytes=_added(now.transferred_bytes, kind, size_bytes))

    def store_measured(self, size_bytes: int) -> None:
        self._update(store_size_bytes=size_bytes)

    @_locked
    def store_damaged(self, reason: str) -> None:
        now = self.snapshot()
        counts, dropped = self._counted(
            {("", r): n for r, n in now.store_corruptions.items()}, [("", reason)]
        )
        self._update(
            store_corruptions={r: n for (_, r), n in counts.items()},
            labels_dropped=now.labels_dropped + dropped,
        )

    def offline_checked(self, condition: Condition) -> None:
        self._update(offline_ready=condition.is_true)

    def mirror_reported(self, mirror: MirrorStatus) -> None:
        self._update(mirror=mirror)

    def releases_reported(self, releases: Sequence[ReleaseRow]) -> None:
        self._update(releases=tuple(releases[:MAX_RELEASE_LABELS]))

    def release_targets(self, targets: Mapping[str, str]) -> None:
        self._update(release_targets=dict(list(targets.items())[:4]))

    # ---------------------------------------------------------------- helpers
    @staticmethod
    def _counted(
        counts: Mapping[tuple[str, str], int], keys: Iterable[tuple[str, str]]
    ) -> tuple[dict[tuple[str, str], int], int]:
        updated: dict[tuple[str, str], int] = dict(counts)
        dropped = 0
        for key in keys:
            updated, is_folded = counted(updated, key)
            dropped += is_folded
        return updated, dropped


def _observed(
    durations: Mapping[Work, Histogram], work: Work, seconds: float
) -> dict[Work, Histogram]:
    return {**durations, work: durations.get(work, Histogram()).observe(max(seconds, 0.0))}


def _added(totals: Mapping[Transfer, int], kind: Transfer, size_bytes: int) -> dict[Transfer, int]:
    return {**totals, kind: totals.get(kind, 0) + max(size_bytes, 0)}
