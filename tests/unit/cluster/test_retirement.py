"""cluster.retirement: which release bundles are unpinned once an upgrade has finished."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.cluster.clusterversion import Release
from nodeagent.cluster.retirement import Plan, by_hand, plan, semver_key, space_note
from nodeagent.cluster.rollout import Rollout, Waiting
from nodeagent.releases import HeldRelease


def digest(n: int) -> str:
    return f"sha256:{n:064x}"


def held(version: str, n: int, *, is_pinned: bool = True) -> HeldRelease:
    return HeldRelease(f"release-{version}", version, digest(n), f"release-{version}", is_pinned)


def release(held: HeldRelease) -> Release:
    return Release(held.version, "", held.digest)


def finished(current: HeldRelease, previous: HeldRelease | None = None) -> Rollout:
    return Rollout(
        release(current),
        release(previous) if previous else None,
        (release(current), release(current)),
    )


def kept(result: Plan) -> dict[str, str]:
    return {v.held.version: v.keep for v in result.verdicts}


V1, V2, V3, V4 = held("4.15.9", 1), held("4.16.0", 2), held("4.16.3", 3), held("4.17.1", 4)


def test_keeps_current_and_previous_retires_the_older_ones() -> None:
    result = plan(finished(V3, V2), [V1, V2, V3], keep_releases=2)
    assert result.reason == "ReleasesRetired"
    assert result.retire == (V1,)
    assert kept(result) == {"4.15.9": "retire", "4.16.0": "previous", "4.16.3": "current"}
    assert "'4.15.9' (release-4.15.9)" in result.message


def test_a_newer_release_carried_for_the_next_upgrade_is_kept() -> None:
    result = plan(finished(V2, V1), [V1, V2, V4], keep_releases=2)
    assert result.retire == ()
    assert result.reason == "NothingToRetire"
    assert kept(result)["4.17.1"] == "newer"


def test_keep_releases_counts_the_current_one() -> None:
    releases = [held(f"4.16.{n}", n) for n in range(6)]
    current = releases[5]
    result = plan(finished(current, releases[4]), releases, keep_releases=4)
    assert {h.version for h in result.retire} == {"4.16.0", "4.16.1"}
    assert kept(result)["4.16.2"] == "kept"


def test_without_history_the_newest_older_release_is_the_previous_one() -> None:
    result = plan(finished(V3), [V1, V2, V3], keep_releases=2)
    assert result.retire == (V1,)
    assert kept(result)["4.16.0"] == "kept"


def test_an_already_unpinned_release_is_not_retired_again() -> None:
    old = held("4.14.0", 9, is_pinned=False)
    result = plan(finished(V3, V2), [old, V2, V3], keep_releases=2)
    assert result.retire == ()
    assert result.reason == "NothingToRetire"


def test_the_current_release_is_matched_by_digest_and_by_version() -> None:
    same_version_other_bundle = HeldRelease("other", "4.16.3", digest(77), "release-4.16.3")
    result = plan(finished(V3, V2), [V1, V2, V3, same_version_other_bundle], keep_releases=2)
    assert {v.held.bundle_id: v.keep for v in result.verdicts}["other"] == "current"


def test_protected_releases_are_never_retired() -> None:
    state = Rollout(release(V3), release(V2), (release(V3), Release("", "", V1.digest)))
    result = plan(state, [V1, V2, V3], keep_releases=2)
    assert result.retire == ()


def test_while_waiting_nothing_is_retired_and_the_reason_is_given() -> None:
    state = Waiting("PoolPaused", "MachineConfigPool 'worker' is paused")
    result = plan(state, [V1, V2, V3], keep_releases=2)
    assert (result.reason, result.retire) == ("PoolPaused", ())
    assert set(kept(result).values()) == {"waiting"}


def test_a_non_semver_cluster_version_retires_nothing() -> None:
    odd = HeldRelease("odd", "4.16-odd", digest(5), "release-odd")
    result = plan(finished(odd), [V1, odd], keep_releases=2)
    assert (result.reason, result.retire) == ("ReleaseVersionInvalid", ())


def test_a_non_semver_held_release_is_kept_and_named() -> None:
    odd = HeldRelease("odd", "nightly", digest(5), "release-odd")
    result = plan(finished(V4, V3), [V1, V2, V3, V4, odd], keep_releases=2)
    assert {h.version for h in result.retire} == {"4.15.9", "4.16.0"}
    assert kept(result)["nightly"] == "invalid"
    assert "not a semantic version: 'nightly'" in result.message


@pytest.mark.parametrize(
    ("low", "high"),
    [
        ("4.16.0", "4.16.1"),
        ("4.9.9", "4.10.0"),
        ("4.16.0-rc.1", "4.16.0"),
        ("4.16.0-rc.2", "4.16.0-rc.10"),
        ("4.16.0-ec.1", "4.16.0-rc.0"),
        ("4.16.0-0.nightly", "4.16.0-rc"),
        ("4.16.0-rc", "4.16.0-rc.1"),
    ],
)
def test_semver_precedence(low: str, high: str) -> None:
    low_key, high_key = semver_key(low), semver_key(high)
    assert low_key is not None and high_key is not None and low_key < high_key


@pytest.mark.parametrize(
    "text", ["", "4.16", "v4.16.0", "4.16.01", "4.16.0-01", "4.16.0-", "9" * 70]
)
def test_not_semver(text: str) -> None:
    assert semver_key(text) is None


def test_build_metadata_is_ignored() -> None:
    assert semver_key("4.16.0+abc") == semver_key("4.16.0")


_versions = st.tuples(
    st.integers(0, 5), st.integers(0, 30), st.integers(0, 30), st.sampled_from(["", "-rc.1", "x"])
).map(lambda t: f"{t[0]}.{t[1]}.{t[2]}{t[3]}")


@given(
    versions=st.lists(_versions, min_size=1, max_size=12, unique=True),
    current_index=st.integers(0, 11),
    keep=st.integers(2, 6),
    has_previous=st.booleans(),
)
def test_retirement_never_touches_what_it_must_keep(
    versions: list[str], current_index: int, keep: int, has_previous: bool
) -> None:
    releases = [held(v, n) for n, v in enumerate(versions)]
    current = releases[current_index % len(releases)]
    others = [r for r in releases if r is not current]
    previous = others[0] if has_previous and others else None
    result = plan(finished(current, previous), releases, keep_releases=keep)
    retired = set(result.retire)
    assert current not in retired and previous not in retired
    current_key = semver_key(current.version)
    if current_key is None:
        assert not retired
        return
    for release in retired:
        key = semver_key(release.version)
        assert key is not None and key < current_key
    survivors = [r for r in releases if r not in retired]
    older_kept = {r.version for r in survivors if (k := semver_key(r.version)) and k < current_key}
    older_all = {r.version for r in releases if (k := semver_key(r.version)) and k < current_key}
    extra = {previous.version} if previous is not None else set()
    assert len(older_kept | extra) >= min(keep - 1, len(older_all | extra))
    # every retired release is older than every kept older release but possibly previous
    for release in retired:
        for other in survivors:
            other_key = semver_key(other.version)
            if other is previous or other_key is None or other_key >= current_key:
                continue
            assert semver_key(release.version) < other_key  # type: ignore[operator]


def test_the_space_note_names_the_releases_kept_and_when_an_older_one_goes() -> None:
    result = plan(finished(V3, V2), [V1, V2, V3, V4], keep_releases=2)
    note = space_note(result)
    assert "'4.16.3' (current)" in note and "'4.16.0' (previous)" in note
    assert "'4.17.1' (newer, for the next upgrade)" in note
    assert "'4.15.9'" not in note  # retired: it holds nothing for long
    assert "once an upgrade past it has completed on every pool" in note
    waiting = plan(Waiting("PoolPaused", "paused"), [V1], keep_releases=2)
    assert space_note(waiting) == ""  # nothing judged kept yet: nothing said
    assert space_note(None) == ""


# ---------------------------------------------------------------- by hand (decision 0072)
def test_by_hand_never_the_current_desired_or_requested_release() -> None:
    current, older, newer = held("4.16.2", 2), held("4.16.1", 1), held("4.16.3", 3)
    state = finished(current, older)
    refusal = by_hand(state, current)
    assert refusal is not None and refusal[0] == "ReleaseInUse"
    desired = Rollout(release(current), release(older), (release(current), release(newer)))
    refusal = by_hand(desired, newer)
    assert refusal is not None and refusal[0] == "ReleaseInUse"
    assert by_hand(state, older) is None  # the previous one: the technician decides
    assert by_hand(state, newer) is None


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("UpgradeNotCompleted", "ReleaseInUse"),
        ("UpgradeRequested", "ReleaseInUse"),
        ("PoolsUnknown", "ReleaseStateUnknown"),
        ("PoolNotUpdated", "ReleaseStateUnknown"),
        ("ClusterVersionInvalid", "ReleaseStateUnknown"),
    ],
)
def test_by_hand_refuses_every_release_while_the_state_is_not_finished(
    reason: str, expected: str
) -> None:
    refusal = by_hand(Waiting(reason, "why"), held("4.16.1", 1))
    assert refusal is not None and refusal[0] == expected and "why" in refusal[1]
