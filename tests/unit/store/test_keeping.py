"""Keep rules, removal after the grace period, and the size cap: pure, table-driven."""

from __future__ import annotations

import pytest

from nodeagent.errors import StoreFull
from nodeagent.store.keeping import (
    KeepRules,
    check_cap,
    decide,
    newest_per_channel,
    plan_removals,
    referenced,
    size_cap,
)
from nodeagent.store.layout import BlobRef, BundleRecord


def _digest(n: int) -> str:
    return f"sha256:{n:064x}"


def record(
    bundle_id: str,
    *,
    sets: tuple[str, ...] = (),
    blobs: tuple[int, ...] = (),
    key: str = "AA",
    channel: str = "default",
    created: str = "2026-01-01T00:00:00Z",
    accepted_at_s: float = 0.0,
    sequence: int | None = None,
) -> BundleRecord:
    refs = tuple(BlobRef(_digest(n), 100 * n) for n in blobs)
    return BundleRecord(
        bundle_id, key, "", channel, created, accepted_at_s, sets, (), refs, sequence=sequence
    )


NOW = 10_000.0
RULES = KeepRules(gc_grace_s=600.0, keep_newest_per_channel=False)


@pytest.mark.parametrize(
    ("records", "pinned", "rules", "kept"),
    [
        ([record("a", sets=("s",))], {"s"}, RULES, {"a": ("pinned",)}),
        ([record("a", sets=("s", "t"))], {"t"}, RULES, {"a": ("pinned",)}),
        ([record("a", sets=("s",))], set(), RULES, {"a": ()}),
        ([record("a", accepted_at_s=NOW - 599)], set(), RULES, {"a": ("recent",)}),
        ([record("a", accepted_at_s=NOW - 600)], set(), RULES, {"a": ()}),
        (
            [
                record("old", created="2026-01-01T00:00:00Z"),
                record("new", created="2026-01-01T00:00:00.5Z"),
            ],
            set(),
            KeepRules(600.0, True),
            {"old": (), "new": ("newest",)},
        ),
        (
            [record("a", key="AA"), record("b", key="BB"), record("c", channel="edge")],
            set(),
            KeepRules(600.0, True),
            {"a": ("newest",), "b": ("newest",), "c": ("newest",)},
        ),
    ],
    ids=["pinned", "any-set", "unpinned", "recent", "grace-over", "newest", "per-key-channel"],
)
def test_keep_rules(
    records: list[BundleRecord], pinned: set[str], rules: KeepRules, kept: dict[str, tuple[str]]
) -> None:
    verdicts = decide(records, pinned, rules, NOW)
    assert {v.record.bundle_id: v.reasons for v in verdicts} == kept


def test_newest_compares_times_not_text() -> None:
    """'…00.5Z' sorts before '…00Z' as text; as a time it is later."""
    early, late = (
        record("x", created="2026-01-01T00:00:00Z"),
        record("y", created="2026-01-01T00:00:00.5Z"),
    )
    assert newest_per_channel([late, early]) == {"y"}


def test_newest_is_the_highest_sequence_the_order_nodes_accept_bundles_in() -> None:
    """A bundle made later with a lower sequence is not the newest; a record written before
    sequences were recorded stands at its created time in seconds (its format 1 sequence)."""
    later_lower = record("later", created="2026-06-01T00:00:00Z", sequence=7)
    higher = record("higher", created="2026-01-01T00:00:00Z", sequence=9)
    assert newest_per_channel([later_lower, higher]) == {"higher"}
    old = record("old", created="2026-01-01T00:00:00Z")  # 1767225600 s
    assert newest_per_channel([old, record("v3", sequence=1767225601)]) == {"v3"}
    assert newest_per_channel([old, record("v3", sequence=1767225599)]) == {"old"}


def test_verdict_says_why() -> None:
    (pinned,) = decide([record("a", sets=("s",))], {"s"}, RULES, NOW)
    assert pinned.describe() == "kept: set s pinned"
    (released,) = decide([record("a", sets=("s",))], set(), RULES, NOW)
    assert released.describe().startswith("released: no set pinned")


def test_blobs_shared_with_a_kept_bundle_stay_referenced() -> None:
    verdicts = decide(
        [record("a", sets=("s",), blobs=(1, 2)), record("b", sets=("t",), blobs=(2, 3))],
        {"t"},
        RULES,
        NOW,
    )
    assert referenced(verdicts) == {_digest(2), _digest(3)}


def test_unreferenced_blobs_are_marked_then_removed_after_the_grace_period() -> None:
    stored, keep = [_digest(1), _digest(2)], frozenset({_digest(2)})
    first = plan_removals(stored, keep, {}, 600.0, NOW)
    assert (first.marks, first.remove) == ({_digest(1): NOW}, ())
    assert first.held == {_digest(1): NOW + 600}
    assert plan_removals(stored, keep, first.marks, 600.0, NOW + 599).remove == ()
    last = plan_removals(stored, keep, first.marks, 600.0, NOW + 600)
    assert (last.remove, last.marks) == ((_digest(1),), {})


def test_a_blob_referenced_again_loses_its_mark_and_a_future_mark_counts_from_now() -> None:
    again = plan_removals([_digest(1)], frozenset({_digest(1)}), {_digest(1): 1.0}, 600.0, NOW)
    assert (again.marks, again.remove) == ({}, ())
    future = plan_removals([_digest(1)], frozenset(), {_digest(1): NOW + 5000}, 600.0, NOW)
    assert future.marks == {_digest(1): NOW}


@pytest.mark.parametrize(
    ("max_bytes", "max_percent", "filesystem", "cap"),
    [(0, 0.0, 1000, None), (500, 0.0, 1000, 500), (0, 10.0, 1000, 100), (50, 10.0, 1000, 50)],
)
def test_size_cap_is_the_smaller_setting(
    max_bytes: int, max_percent: float, filesystem: int, cap: int | None
) -> None:
    assert size_cap(max_bytes, max_percent, filesystem) == cap


def test_check_cap_refuses_with_figures_and_what_to_do() -> None:
    check_cap("bundle a", 100, 900, 1000)
    check_cap("bundle a", 10**12, 0, None)
    with pytest.raises(StoreFull) as caught:
        check_cap("bundle a", 101, 900, 1000, releasable_bytes=300)
    message = caught.value.message
    assert "bundle a needs 101 B more" in message and "cap of 1000 B" in message
    assert "300 B of it is no longer needed" in message and "Free 1 B" in message
    assert caught.value.exit_code == 73
