"""What the store keeps and why, what it removes and when, and its size cap: pure rules.

Keep rules (docs/store.md), over the bundle records and the sets pinned now:

- a bundle is kept while any of its PinnedImageSets is pinned (``pinned``);
- a bundle copied less than the grace period ago is kept (``recent``): its import into
  the runtime and the pinning of its sets come after the copy;
- with ``keep_newest_per_channel``, the newest bundle (its signed sequence, the order nodes
  accept bundles in) of each signing key and channel is kept (``newest``), for peers and
  to re-pin without a stick;
- a bundle holding the image nodeagent itself runs (the container variant, ``self_digests``)
  is kept as pinned by the set ``nodeagent-self`` (``specs.SELF_SET``), always: peers and a
  restore find the agent's image, and nothing unpins it (decision 0074);
- the signed manifest, signature and record of every accepted bundle are always kept
  (small; anti-rollback needs them): only blobs are ever removed.

A registry set's record (``[store] registry_sets``) follows the first two rules: kept
while its set is pinned, and for the grace period after its blobs were fetched (the pull
into the runtime and the pinning come after). It has no key or channel (``newest`` never
applies); once released, its record goes with it (``adapters.store.keeper.collect``).

Blobs that no kept bundle refers to are marked with the time they were first found so,
and removed once they have been unreferenced for ``gc_grace_s`` (``plan_removals``); a
blob referred to again loses its mark. Nothing here sleeps or reads a clock: ``now_s``
is given.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from nodeagent.errors import StoreFull
from nodeagent.specs import SELF_SET
from nodeagent.store.layout import BundleRecord
from nodeagent.units import format_bytes

KeepReason = Literal["pinned", "recent", "newest"]


@dataclass(frozen=True, slots=True)
class KeepRules:
    """``[store]`` settings the rules need."""

    gc_grace_s: float = 3600.0
    keep_newest_per_channel: bool = True


@dataclass(frozen=True, slots=True)
class BundleVerdict:
    """Whether a bundle's blobs are kept, and every reason that keeps them."""

    record: BundleRecord
    reasons: tuple[KeepReason, ...]
    pinned_sets: tuple[str, ...] = ()

    @property
    def is_kept(self) -> bool:
        return bool(self.reasons)

    def describe(self) -> str:
        """Why, in one phrase a technician reads: ``kept: set line-3 is pinned``."""
        if not self.reasons:
            if self.record.is_registry:
                return "released: its set is not pinned (fetched again from its registry)"
            return "released: no set pinned (its signed manifest stays)"
        parts = []
        for reason in self.reasons:
            if reason == "pinned":
                parts.append(f"set {', '.join(self.pinned_sets)} pinned")
            elif reason == "recent":
                done = "fetched" if self.record.is_registry else "copied"
                parts.append(f"{done} within the grace period")
            else:
                parts.append(f"newest of key {self.record.key_id} channel {self.record.channel}")
        return "kept: " + "; ".join(parts)


def created_order(record: BundleRecord) -> tuple[float, dt.datetime, float, str]:
    """Sort key: the bundle's signed sequence, the order nodes accept bundles in
    (docs/bundle-format.md#anti-rollback; a record without one: its ``created`` in seconds,
    which is the sequence of a bundle of format 1 or 2), then its ``created`` time (a time
    that does not parse sorts first), then when it was accepted, then its id."""
    try:
        created = dt.datetime.fromisoformat(record.created.replace("Z", "+00:00"))
    except ValueError:
        created = dt.datetime.min.replace(tzinfo=dt.UTC)
    if created.tzinfo is None:
        created = created.replace(tzinfo=dt.UTC)
    sequence = record.sequence
    if sequence is None:
        sequence = max(0, int(created.timestamp())) if created.year > 1 else -1
    return sequence, created, record.accepted_at_s, record.bundle_id


def newest_per_channel(records: Iterable[BundleRecord]) -> set[str]:
    """The id of the newest bundle of each (signing key, channel)."""
    newest: dict[tuple[str, str], BundleRecord] = {}
    for record in records:
        if record.is_registry:
            continue  # no key, no channel: a registry set is kept while it is pinned
        key = (record.key_id, record.channel)
        if key not in newest or created_order(record) > created_order(newest[key]):
            newest[key] = record
    return {record.bundle_id for record in newest.values()}


def decide(
    records: Sequence[BundleRecord],
    pinned_sets: Iterable[str],
    rules: KeepRules,
    now_s: float,
    self_digests: frozenset[str] = frozenset(),
) -> tuple[BundleVerdict, ...]:
    """One verdict per record, in the records' order; ``self_digests``: the manifest
    digests of nodeagent's own image (kept by ``nodeagent-self``)."""
    pinned = set(pinned_sets)
    newest = newest_per_channel(records) if rules.keep_newest_per_channel else set()
    verdicts = []
    for record in records:
        sets = tuple(name for name in record.sets if name in pinned)
        if any(image.digest in self_digests for image in record.images):
            sets += (SELF_SET,)
        reasons: list[KeepReason] = ["pinned"] if sets else []
        if now_s - record.accepted_at_s < rules.gc_grace_s:
            reasons.append("recent")
        if record.bundle_id in newest:
            reasons.append("newest")
        verdicts.append(BundleVerdict(record, tuple(reasons), sets))
    return tuple(verdicts)


def referenced(verdicts: Iterable[BundleVerdict]) -> frozenset[str]:
    """Every digest a kept bundle refers to."""
    return frozenset(d for v in verdicts if v.is_kept for d in v.record.digests)


@dataclass(frozen=True, slots=True)
class RemovalPlan:
    """``plan_removals``' answer: the marks to record and the blobs to remove now."""

    marks: dict[str, float]
    """Digest → when first found unreferenced, for every unreferenced blob kept for now."""
    remove: tuple[str, ...]
    """Unreferenced for the whole grace period: remove now."""
    held: dict[str, float] = field(default_factory=dict)
    """Digest → Unix time it will be removed at (the marked ones)."""


def plan_removals(
    stored: Iterable[str],
    keep: frozenset[str],
    marks: Mapping[str, float],
    grace_s: float,
    now_s: float,
) -> RemovalPlan:
    """Mark newly unreferenced blobs, remove those marked ``grace_s`` ago or more.

    A mark in the future (the clock was set back) counts from now: a blob is never removed
    earlier than ``grace_s`` after it was last seen unreferenced by a sane clock.
    """
    new_marks: dict[str, float] = {}
    remove = []
    for digest in sorted(set(stored) - keep):
        marked_s = min(marks.get(digest, now_s), now_s)
        if now_s - marked_s >= grace_s:
            remove.append(digest)
        else:
            new_marks[digest] = marked_s
    held = {digest: marked_s + grace_s for digest, marked_s in new_marks.items()}
    return RemovalPlan(new_marks, tuple(remove), held)


# ---------------------------------------------------------------- size cap
def size_cap(max_bytes: int, max_percent: float, filesystem_bytes: int) -> int | None:
    """The cap on the store's blobs: the smaller of the two settings that are set (0: unset)."""
    caps = [max_bytes] if max_bytes > 0 else []
    if max_percent > 0:
        caps.append(int(filesystem_bytes * max_percent / 100))
    return min(caps) if caps else None


def check_cap(
    what: str, missing_bytes: int, stored_bytes: int, cap: int | None, releasable_bytes: int = 0
) -> None:
    """Raise ``StoreFull`` unless ``missing_bytes`` more fit under ``cap`` (None: no cap)."""
    if cap is None or stored_bytes + missing_bytes <= cap:
        return
    short = stored_bytes + missing_bytes - cap
    waiting = (
        f"; {format_bytes(releasable_bytes)} of it is no longer needed and goes after the "
        "grace period"
        if releasable_bytes
        else ""
    )
    raise StoreFull(
        f"{what} needs {format_bytes(missing_bytes)} more in the image store, which holds "
        f"{format_bytes(stored_bytes)} of its cap of {format_bytes(cap)}{waiting}; nothing was "
        f"copied. Free {format_bytes(short)} (unpin sets no longer needed: nodeagent store "
        "shows what is kept and why) or raise [store] max_bytes / max_percent"
    )
