"""The values a scrape reads, and the pure rules that keep their labels bounded."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Final

from nodeagent.progress import new_blob_bytes as new_blob_bytes
from nodeagent.releases import ReleaseRow
from nodeagent.status import MirrorStatus, SetStatus

MAX_SET_LABELS: Final = 64
"""Sets with a label of their own (the first by name); the others are summed under
``OTHER_SETS``, so a node given thousands of sets still exports a bounded series count."""
OTHER_SETS: Final = "_other"
"""The label of the sets beyond the cap (a Kubernetes name never starts with ``_``)."""
MAX_REASON_LABELS: Final = 64
"""Distinct (outcome, reason) pairs kept per counter; beyond them ``OTHER_REASON``."""
OTHER_REASON: Final = "Other"

DURATION_BUCKETS_S: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
"""Upper bounds of the duration histograms: a small image pulls in a second, a release's
payload in tens of minutes."""


class Transfer(StrEnum):
    """Where counted bytes went (label ``kind`` of ``nodeagent_transferred_bytes_total``)."""

    PULLED = "pulled"
    """From a registry: by CRI-O, the compressed blobs of each pulled image not already on
    the node; by nodeagent into its store (``[store] registry_sets``), what it downloaded."""
    IMPORTED = "imported"
    """From a bundle's medium into the node's store."""
    RESTORED = "restored"
    """From the node's store into CRI-O."""
    SERVED = "served"
    """From the node's store to a peer."""
    FETCHED = "fetched"
    """From a peer into the node's store."""
    MIRRORED = "mirrored"
    """From the node's store to a local client (CRI-O, podman, skopeo) by the node mirror."""


class Work(StrEnum):
    """What a duration histogram times (label ``work``)."""

    PULL = "pull"
    IMPORT = "import"
    RESTORE = "restore"


MAX_RELEASE_LABELS: Final = 20
"""Releases exported (the NodeImageStatus bound); targets: at most 4."""


@dataclass(frozen=True, slots=True)
class SetRow:
    """One set's gauges (or the sum of the sets beyond the cap, without a generation)."""

    name: str
    wanted: int
    present: int
    pinned: int
    failed: int
    generation: int | None


@dataclass(frozen=True, slots=True)
class Histogram:
    """Observations per bucket (not cumulative; the last count is above every bound)."""

    bounds: tuple[float, ...] = DURATION_BUCKETS_S
    counts: tuple[int, ...] = (0,) * (len(DURATION_BUCKETS_S) + 1)
    total: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, value: float) -> Histogram:
        index = bisect.bisect_left(self.bounds, value)
        counts = list(self.counts)
        counts[index] += 1
        return replace(self, counts=tuple(counts), total=self.total + value)

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound as the exposition writes it, observations at or below it), +Inf last."""
        running = 0
        found: list[tuple[str, int]] = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            found.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return found


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scrape exports, copied at once. ``None``: not known yet (never 0)."""

    sets: tuple[SetRow, ...] = ()
    sets_reported: bool = False
    """Whether a sync has reported its sets (before that, no set gauge is exported)."""
    transferred_bytes: Mapping[Transfer, int] = field(default_factory=dict)
    durations: Mapping[Work, Histogram] = field(default_factory=dict)
    bundles: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(outcome, reason) -> bundles that ended so."""
    admissions: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(decision, reason) -> sets decided so, over every sync."""
    refused_sets: int | None = None
    """Sets the last admission refused for space (not known before the first admission)."""
    store_size_bytes: int | None = None
    last_sync_unix_s: float | None = None
    offline_ready: bool | None = None
    store_corruptions: Mapping[str, int] = field(default_factory=dict)
    """Reason code -> damaged blobs or records found in the node's store."""
    labels_dropped: int = 0
    """Reason pairs folded into ``OTHER_REASON`` because a counter reached its cap."""
    mirror: MirrorStatus | None = None
    """The node mirror as the peer process last reported it (None: no report yet)."""
    releases: tuple[ReleaseRow, ...] = ()
    release_targets: Mapping[str, str] = field(default_factory=dict)
    """Digest -> version of the releases ClusterVersion asks for (cluster mode)."""


def set_rows(sets: Sequence[SetStatus], cap: int = MAX_SET_LABELS) -> tuple[SetRow, ...]:
    """One row per set by name, the first ``cap`` by name; the rest summed as ``OTHER_SETS``."""
    ordered = sorted(sets, key=lambda s: s.name)
    rows = [_row(s) for s in ordered[:cap]]
    rest = ordered[cap:]
    if rest:
        rows.append(
            SetRow(
                OTHER_SETS,
                wanted=sum(s.images_total for s in rest),
                present=sum(s.images_present for s in rest),
                pinned=sum(s.images_pinned for s in rest),
                failed=sum(len(s.failures) for s in rest),
                generation=None,
            )
        )
    return tuple(rows)


def _row(status: SetStatus) -> SetRow:
    return SetRow(
        status.name,
        wanted=status.images_total,
        present=status.images_present,
        pinned=status.images_pinned,
        failed=len(status.failures),
        generation=status.desired_generation,
    )


def counted(
    counts: Mapping[tuple[str, str], int], key: tuple[str, str], cap: int = MAX_REASON_LABELS
) -> tuple[dict[tuple[str, str], int], bool]:
    """``counts`` with ``key`` counted once more; a new key past ``cap`` pairs is counted as
    (its outcome, ``OTHER_REASON``). Returns the new counts and whether the key was folded."""
    updated = dict(counts)
    is_folded = key not in updated and len(updated) >= cap
    if is_folded:
        key = (key[0], OTHER_REASON)
    updated[key] = updated.get(key, 0) + 1
    return updated, is_folded
