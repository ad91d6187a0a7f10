"""Anti-rollback across formats and key rotations (``nodeagent.bundles.freshness``;
docs/decisions/0040-anti-rollback.md, amended for issue 24 finding 11): a key's older formats
are refused after a newer one, and keys linked by ``supersedes`` share their marks."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.bundles import freshness
from nodeagent.bundles.freshness import Stamp, check, judge, lineage
from nodeagent.errors import BundleFormatDowngrade, BundleManifestInvalid, BundleRollback
from tests.unit.bundles.test_manifest import manifest_doc, parse

OLD, NEW, OTHER, NEWEST = "A1B2C3", "D4E5F6", "BEEF", "C0FFEE"
CREATED_S = 1795339800  # manifest_doc's created: a format 1 bundle's sequence


def stamp(
    key: str,
    sequence: int,
    *,
    fmt: int = 3,
    supersedes: tuple[str, ...] = (),
    digest: str = "a",
    channel: str = "default",
) -> Stamp:
    return Stamp(
        key,
        channel,
        sequence,
        f"sha256:{digest * 64}",
        f"{key}-{sequence}-{digest}",
        format_version=fmt,
        supersedes=supersedes,
    )


# ---------------------------------------------------------------- supersedes in bundle.json
def v3(**changes: Any) -> dict[str, Any]:
    return manifest_doc(**{"formatVersion": 3, "sequence": 5, **changes})


def test_supersedes_is_read_sorted() -> None:
    m = parse(v3(supersedes=["D4E5F6", "A1B2C3"]))
    assert (m.supersedes, m.format_version) == (("A1B2C3", "D4E5F6"), 3)
    assert parse(v3()).supersedes == ()
    assert parse(manifest_doc()).format_version == 1


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ([], "a list of 1 to 8 key ids"),
        ("A1B2C3", "a list of 1 to 8 key ids"),
        (["A"] * 9, "a list of 1 to 8 key ids"),
        (["a1b2c3"], "not a key id"),
        (["0A1"], "not a key id"),  # key_id_hex writes no leading zero
        (["1" * 17], "not a key id"),
        ([7], "not a key id"),
        (["\x1b[2J"], "not a key id"),
        (["A1", "A1"], "names a key twice"),
    ],
)
def test_R39_bad_supersedes_is_refused(value: object, needle: str) -> None:
    with pytest.raises(BundleManifestInvalid, match=needle) as raised:
        parse(v3(supersedes=value))
    assert "\x1b" not in raised.value.message


@pytest.mark.parametrize("version", [1, 2])
def test_R39_supersedes_needs_format_3(version: int) -> None:
    doc = manifest_doc(formatVersion=version, supersedes=["A1"])
    with pytest.raises(BundleManifestInvalid, match="supersedes needs formatVersion 3"):
        parse(doc)


# ---------------------------------------------------------------- lineage
def test_keys_stay_apart_without_a_declaration() -> None:
    assert lineage(NEW, [stamp(OLD, 9), stamp(NEW, 1)]) == {NEW}


def test_a_declaration_links_both_ways_and_transitively() -> None:
    accepted = [stamp(NEW, 1, supersedes=(OLD,)), stamp(NEWEST, 2, supersedes=(NEW,))]
    assert lineage(OLD, accepted) == lineage(NEWEST, accepted) == {OLD, NEW, NEWEST}
    assert lineage(OTHER, accepted) == {OTHER}


def test_the_candidates_own_declaration_counts() -> None:
    assert lineage(NEW, [stamp(OLD, 9)], declared=(OLD,)) == {OLD, NEW}


# ---------------------------------------------------------------- the format rule
@pytest.mark.parametrize(
    ("accepted", "candidate", "verdict"),
    [
        pytest.param([stamp(OLD, 5)], stamp(OLD, CREATED_S, fmt=1), "downgrade", id="3-then-1"),
        pytest.param([stamp(OLD, 5)], stamp(OLD, CREATED_S, fmt=2), "downgrade", id="3-then-2"),
        pytest.param([stamp(OLD, 5, fmt=2)], stamp(OLD, 9, fmt=1), "downgrade", id="2-then-1"),
        pytest.param([stamp(OLD, 5, fmt=1)], stamp(OLD, 6, fmt=3), "fresh", id="1-then-3"),
        pytest.param([stamp(OLD, 5, fmt=1)], stamp(OLD, 6, fmt=1), "fresh", id="same-format"),
        pytest.param([stamp(OTHER, 5)], stamp(OLD, 6, fmt=1), "fresh", id="other-key"),
        pytest.param(
            [stamp(OLD, 5, channel="apps")], stamp(OLD, 6, fmt=1), "downgrade", id="any-channel"
        ),
        pytest.param(
            [stamp(OLD, 5, fmt=1), stamp(OLD, 3, fmt=3, channel="apps")],
            stamp(OLD, 5, fmt=1),
            "same",
            id="re-import-of-the-mark",
        ),
    ],
)
def test_R40_the_format_rule(accepted: list[Stamp], candidate: Stamp, verdict: str) -> None:
    assert judge(candidate, accepted).verdict == verdict


def test_a_downgrade_says_what_and_how_to_go_back() -> None:
    checked = check(stamp(OLD, CREATED_S, fmt=1), None, [stamp(OLD, 5)], None)
    assert isinstance(checked.refusal, BundleFormatDowngrade)
    assert isinstance(checked.refusal, BundleRollback)  # the fetcher skips it as a Rollback
    assert checked.refusal.reason == "BundleFormatDowngrade"
    assert "format 1, older than bundle A1B2C3-5-a (format 3)" in checked.refusal.message
    assert "--allow-rollback" in checked.refusal.message
    by_hand = check(
        stamp(OLD, CREATED_S, fmt=1), None, [stamp(OLD, 5)], None, is_allowing_rollback=True
    )
    assert by_hand.refusal is None and by_hand.passed_mark == stamp(OLD, 5)


# ---------------------------------------------------------------- rotation with supersedes
ROTATED = [stamp(OLD, 100), stamp(NEW, 200, supersedes=(OLD,), digest="b")]


@pytest.mark.parametrize(
    ("accepted", "candidate", "verdict"),
    [
        pytest.param(ROTATED, stamp(OLD, 150, digest="c"), "rollback", id="old-key-below-new"),
        pytest.param(ROTATED, stamp(OLD, 200, digest="c"), "reused", id="old-key-at-new"),
        pytest.param(ROTATED, stamp(OLD, 201, digest="c"), "fresh", id="old-key-above-new"),
        pytest.param(ROTATED, stamp(NEW, 150, digest="c"), "rollback", id="new-key-below"),
        pytest.param(
            [stamp(OLD, 100)], stamp(NEW, 50, supersedes=(OLD,)), "rollback", id="first-below-old"
        ),
        pytest.param(
            [stamp(OLD, 100)], stamp(NEW, 101, supersedes=(OLD,)), "fresh", id="first-above-old"
        ),
        pytest.param([stamp(OLD, 100)], stamp(NEW, 50), "fresh", id="no-declaration-apart"),
        pytest.param(
            [stamp(OLD, 100), stamp(NEW, 50)],
            stamp(OLD, 60, digest="c"),
            "rollback",
            id="no-declaration-old-own-mark",
        ),
        pytest.param(
            [stamp(OLD, 100), stamp(NEW, 200, supersedes=(OLD,), channel="apps")],
            stamp(OLD, 150, digest="c"),
            "fresh",
            id="marks-are-per-channel",
        ),
        pytest.param(
            [*ROTATED, stamp(NEWEST, 300, supersedes=(NEW,), digest="d")],
            stamp(OLD, 250, digest="c"),
            "rollback",
            id="two-rotations",
        ),
        pytest.param(
            [stamp(OLD, 100, fmt=1), stamp(NEW, 5, supersedes=(OLD,))],
            stamp(OLD, CREATED_S, fmt=1, digest="c"),
            "downgrade",
            id="old-key-old-format-after-new-key-format-3",
        ),
    ],
)
def test_R41_marks_cross_keys_only_with_supersedes(
    accepted: list[Stamp], candidate: Stamp, verdict: str
) -> None:
    assert judge(candidate, accepted).verdict == verdict


def test_an_old_key_refused_below_the_new_keys_mark_names_both_keys() -> None:
    refusal = check(stamp(OLD, 150, digest="c"), None, ROTATED, None).refusal
    assert refusal is not None and refusal.reason == "BundleRollback"
    assert f"key {NEW} channel default (linked by supersedes to key {OLD}" in refusal.message


def test_lowered_marks_stay_per_key() -> None:
    # A stored manifest is replaced only under its own id: unchanged by lineages.
    assert freshness.lowered_marks(stamp(OLD, 1, digest="z"), ROTATED) == ()
