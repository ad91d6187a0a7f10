"""A bundle's channel, sequence and expiry (format 3) and the anti-rollback rule
(``nodeagent.bundles.freshness``; docs/bundle-format.md, rules R33-R35)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.bundles import freshness
from nodeagent.bundles.freshness import MAX_SEQUENCE, Stamp, judge
from nodeagent.errors import BundleExpired, BundleManifestInvalid
from tests.unit.bundles.test_manifest import manifest_doc, parse

NOW = dt.datetime(2026, 11, 26, 12, 0, 0, tzinfo=dt.UTC)
KEY, OTHER_KEY = "A1B2C3", "D4E5F6"


def v3(**changes: Any) -> dict[str, Any]:
    return manifest_doc(**{"formatVersion": 3, "sequence": 5, **changes})


def stamp(sequence: int, digest: str = "a", channel: str = "default", key: str = KEY) -> Stamp:
    return Stamp(key, channel, sequence, f"sha256:{digest * 64}", f"b-{sequence}-{digest}")


# ---------------------------------------------------------------- parsing (R33)
def test_format_3_carries_sequence_and_expires() -> None:
    m = parse(v3(expires="2027-01-31T00:00:00Z", channel="release"))
    assert (m.channel, m.sequence, m.expires) == ("release", 5, "2027-01-31T00:00:00Z")
    assert parse(v3()).expires is None


def test_format_3_with_a_target_reads_it() -> None:
    m = parse(v3(target={"nodeSelector": "site=line-3"}))
    assert m.target is not None and m.target.selector_text == "site=line-3"


@pytest.mark.parametrize(
    ("created", "sequence"),
    [
        ("2026-11-22T09:30:00Z", 1795339800),
        ("2026-11-22T09:30:00.999999999Z", 1795339800),
        ("1970-01-01T00:00:00Z", 0),
        ("1969-12-31T23:59:59Z", 0),
        ("9999-12-31T23:59:59Z", 253402300799),
    ],
)
def test_an_older_bundle_has_its_created_time_as_sequence(created: str, sequence: int) -> None:
    assert parse(manifest_doc(created=created)).sequence == sequence
    assert parse(manifest_doc(formatVersion=2, created=created)).sequence == sequence


def test_sequence_bounds_are_those_of_a_double() -> None:
    assert parse(v3(sequence=0)).sequence == 0
    assert parse(v3(sequence=MAX_SEQUENCE)).sequence == (1 << 53) - 1


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        pytest.param({"sequence": -1}, "from 0 to", id="R33-negative"),
        pytest.param({"sequence": 1 << 53}, "from 0 to", id="R33-too-big"),
        pytest.param({"sequence": True}, "integer", id="R33-bool"),
        pytest.param({"sequence": 5.0}, "integer", id="R33-float"),
        pytest.param({"sequence": "5"}, "integer", id="R33-string"),
        pytest.param({"sequence": None}, "integer", id="R33-null"),
        pytest.param({"expires": "2027-01-31"}, "RFC 3339", id="R33-expires-date"),
        pytest.param({"expires": "2027-01-31T00:00:00+01:00"}, "RFC 3339", id="R33-offset"),
        pytest.param({"expires": "2027-02-30T00:00:00Z"}, "no real time", id="R33-no-day"),
        pytest.param({"expires": 1798675200}, "string", id="R33-expires-number"),
        pytest.param({"channel": "a/b"}, "channel", id="R33-channel"),
    ],
)
def test_bad_freshness_fields_are_refused(changes: dict[str, Any], needle: str) -> None:
    doc = v3(**changes)
    with pytest.raises(BundleManifestInvalid) as info:
        parse(doc)
    assert needle in info.value.message


def test_R33_a_sequence_is_missing_from_format_3() -> None:
    doc = v3()
    del doc["sequence"]
    with pytest.raises(BundleManifestInvalid, match="sequence must be an integer"):
        parse(doc)


@pytest.mark.parametrize("key", ["sequence", "expires"])
def test_R33_freshness_fields_need_format_3(key: str) -> None:
    """A reader of version 1 or 2 would ignore them: such a bundle is refused, not read."""
    value = 5 if key == "sequence" else "2027-01-31T00:00:00Z"
    with pytest.raises(BundleManifestInvalid, match="needs formatVersion 3"):
        parse(manifest_doc(**{key: value}))


def test_created_that_names_no_real_time_is_refused() -> None:
    with pytest.raises(BundleManifestInvalid, match="no real time"):
        parse(manifest_doc(created="2026-13-01T00:00:00Z"))


# ---------------------------------------------------------------- the rule (R34)
@pytest.mark.parametrize(
    ("accepted", "candidate", "verdict"),
    [
        pytest.param([], stamp(3), "fresh", id="R34-first"),
        pytest.param([stamp(5)], stamp(6), "fresh", id="R34-newer"),
        pytest.param([stamp(5)], stamp(5), "same", id="R34-same-bundle"),
        pytest.param([stamp(5)], stamp(3), "rollback", id="R34-older"),
        pytest.param([stamp(5)], stamp(5, "b"), "reused", id="R34-same-sequence-other-bundle"),
        pytest.param([stamp(3), stamp(5)], stamp(3), "rollback", id="R34-replay-of-one-taken"),
        pytest.param([stamp(5, channel="release")], stamp(3), "fresh", id="R34-other-channel"),
        pytest.param([stamp(5, key=OTHER_KEY)], stamp(3), "fresh", id="R34-other-key"),
        pytest.param([stamp(5), stamp(5, "b")], stamp(5, "b"), "same", id="R34-both-taken"),
    ],
)
def test_the_rule(accepted: list[Stamp], candidate: Stamp, verdict: str) -> None:
    assert judge(candidate, accepted).verdict == verdict


def test_the_high_water_mark_does_not_depend_on_the_order_read() -> None:
    found = {freshness.high_water(order, KEY, "default") for order in
             ([stamp(5, "a"), stamp(5, "b")], [stamp(5, "b"), stamp(5, "a")])}  # fmt: skip
    assert found == {stamp(5, "a")}


def test_a_rollback_says_what_it_is_older_than_and_what_to_do() -> None:
    judgement = judge(stamp(3), [stamp(5)])
    assert judgement.mark == stamp(5)
    error = freshness.rollback_error(stamp(3), stamp(5))
    assert error.reason == "BundleRollback"
    assert "sequence 3, lower than bundle b-5-a (sequence 5)" in error.message
    assert f"key {KEY} channel default" in error.message
    assert "--allow-rollback" in error.message
    reused = freshness.rollback_error(stamp(5, "b"), stamp(5))
    assert "another manifest" in reused.message


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 6), st.sampled_from("abc"), st.sampled_from(["default", "apps"]),
            st.sampled_from([KEY, OTHER_KEY]), st.sampled_from(["x", "y", "z"]),
            st.booleans(),
        ),
        max_size=30,
    )
)  # fmt: skip
def test_accepted_sequences_are_monotone_per_key_and_channel(
    offers: list[tuple[int, str, str, str, str, bool]],
) -> None:
    """Whatever comes, in whatever order, with or without ``--allow-rollback``, into a store
    that keeps one signed manifest per bundle id (a bundle replaces its id's): a key and
    channel's high-water mark never goes down; without the flag a bundle is taken only above
    the mark, or at it as a manifest the store holds at that sequence already."""
    store: dict[str, Stamp] = {}
    for sequence, digest, channel, key, bundle_id, is_by_hand in offers:
        candidate = Stamp(key, channel, sequence, f"sha256:{digest * 64}", bundle_id)
        before = dict(store)
        checked = freshness.check(
            candidate, None, before.values(), NOW, is_allowing_rollback=is_by_hand
        )
        if checked.refusal is not None:
            continue
        store[bundle_id] = candidate
        for line in {(s.key_id, s.channel) for s in before.values()}:
            old, new = (
                freshness.high_water(before.values(), *line),
                freshness.high_water(store.values(), *line),
            )
            assert old is not None and new is not None and new.sequence >= old.sequence
        mark = freshness.high_water(before.values(), key, channel)
        if checked.passed_mark is None and mark is not None:
            held = {s.manifest_digest for s in before.values() if s.sequence == mark.sequence
                    and (s.key_id, s.channel) == (key, channel)}  # fmt: skip
            assert sequence > mark.sequence or (
                sequence == mark.sequence and candidate.manifest_digest in held
            )


def test_a_bundle_never_replaces_the_manifest_that_holds_a_mark() -> None:
    """The store keeps one manifest per bundle id: one reusing the id of another line's mark
    would drop it, even one taken by hand."""
    mark = Stamp(KEY, "release", 10, f"sha256:{'a' * 64}", "x")
    same_id = Stamp(KEY, "apps", 3, f"sha256:{'b' * 64}", "x")
    checked = freshness.check(same_id, None, [mark], NOW, is_allowing_rollback=True)
    assert checked.refusal is not None and checked.refusal.reason == "BundleRollback"
    assert "would replace the signed manifest" in checked.refusal.message
    newer = Stamp(KEY, "release", 11, f"sha256:{'c' * 64}", "x")
    assert freshness.check(newer, None, [mark], NOW).refusal is None


def test_by_hand_a_rollback_passes_and_names_the_mark() -> None:
    checked = freshness.check(stamp(3), None, [stamp(5)], NOW, is_allowing_rollback=True)
    assert (checked.refusal, checked.passed_mark) == (None, stamp(5))
    refused = freshness.check(stamp(3), None, [stamp(5)], NOW)
    assert refused.refusal is not None and "lower than" in refused.refusal.message


def test_by_hand_an_expired_bundle_passes_and_still_meets_the_sequence_rule() -> None:
    past = "2026-01-01T00:00:00Z"
    assert freshness.check(stamp(6), past, [stamp(5)], NOW).refusal is not None
    ignored = freshness.check(stamp(6), past, [stamp(5)], NOW, is_allowing_expired=True)
    assert (ignored.refusal, ignored.is_expiry_ignored) == (None, True)
    both = freshness.check(stamp(3), past, [stamp(5)], NOW, is_allowing_expired=True)
    assert both.refusal is not None and both.refusal.reason == "BundleRollback"


# ---------------------------------------------------------------- expiry (R35)
@pytest.mark.parametrize(
    ("expires", "is_expired"),
    [
        pytest.param(None, False, id="R35-never"),
        pytest.param("2026-11-26T12:00:01Z", False, id="R35-later"),
        pytest.param("2026-11-26T12:00:00Z", True, id="R35-that-instant"),
        pytest.param("2026-11-26T11:59:59.5Z", True, id="R35-past"),
    ],
)
def test_expiry(expires: str | None, is_expired: bool) -> None:
    assert freshness.is_expired(expires, NOW) is is_expired


def test_an_expired_bundle_says_when_and_by_which_clock() -> None:
    error = freshness.expired_error("b", "2026-11-01T00:00:00Z", NOW)
    assert error.reason == "BundleExpired"
    assert "expired at 2026-11-01T00:00:00Z; this node's clock says 2026-11-26T12:00:00Z" in (
        error.message
    )
    assert "--allow-expired" in error.message


def test_the_refusal_names_the_clock_it_was_judged_by() -> None:
    """``check``'s refusal carries the time it was given: a node whose clock was stepped
    forward says so, and the same bundle an hour earlier is taken."""
    candidate = stamp(5)
    later = NOW + dt.timedelta(hours=1)
    refused = freshness.check(candidate, "2026-11-26T12:30:00Z", (), later).refusal
    assert isinstance(refused, BundleExpired)
    assert "expired at 2026-11-26T12:30:00Z; this node's clock says 2026-11-26T13:00:00Z" in (
        refused.message
    )
    assert freshness.check(candidate, "2026-11-26T12:30:00Z", (), NOW).refusal is None


@pytest.mark.parametrize(
    ("text", "expires"),
    [
        ("30d", "2026-12-26T12:00:00Z"),
        ("12h", "2026-11-27T00:00:00Z"),
        ("90m", "2026-11-26T13:30:00Z"),
        ("2027-01-31T00:00:00Z", "2027-01-31T00:00:00Z"),
    ],
)
def test_the_expires_option(text: str, expires: str) -> None:
    assert freshness.expiry_from_option(text, NOW) == expires


@pytest.mark.parametrize("text", ["0d", "30", "30 d", "-1d", "1w", "2027-01-31", "9999999d"])
def test_a_bad_expires_option_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="neither"):
        freshness.expiry_from_option(text, NOW)
