"""cluster.one_touch: start the upgrade only when every node pinned a release that upgrades."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.cluster.one_touch import count_ready, decide
from nodeagent.cluster.starting import lease_is_fresh
from nodeagent.releases import HeldRelease

T = "2026-11-28T10:00:00Z"
OLD, NEW, NEWER = ("sha256:" + c * 64 for c in "abc")
REPO = "quay.io/openshift-release-dev/ocp-release"


def cv(*, desired_update: dict[str, Any] | None = None, state: str = "Completed") -> dict[str, Any]:
    spec: dict[str, Any] = {"clusterID": "x"}
    if desired_update:
        spec["desiredUpdate"] = desired_update
    return {
        "metadata": {"name": "version"},
        "spec": spec,
        "status": {
            "desired": {"version": "4.16.3", "image": f"{REPO}@{OLD}"},
            "history": [
                {"state": state, "version": "4.16.3", "image": f"{REPO}@{OLD}", "startedTime": T}
            ],
        },
    }


def held(version: str, digest: str) -> HeldRelease:
    return HeldRelease(
        f"b-{version}", version, digest, f"release-{version}", image=f"{REPO}@{digest}"
    )


def nis(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"releases": list(entries)}}


def entry(digest: str, *, pinned: bool = True, reason: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {"digest": digest, "version": "x", "set": "s", "pinned": pinned}
    return found | ({"reason": reason} if reason else {})


NODES = ["edge-1", "edge-2"]
READY = {"edge-1": nis(entry(NEW)), "edge-2": nis(entry(NEW))}


def test_every_node_pinned_a_newer_release_starts_it() -> None:
    decision = decide(cv(), NODES, READY, [held("4.17.0", NEW)])
    assert decision.reason == "SiteReady"
    assert decision.release is not None and decision.release.digest == NEW
    assert "every node (2) has pinned release '4.17.0'" in decision.message


@pytest.mark.parametrize(
    ("statuses", "words"),
    [
        ({"edge-1": nis(entry(NEW))}, "'edge-2' (no status)"),
        ({"edge-1": nis(entry(NEW)), "edge-2": nis(entry(NEW, pinned=False))}, "not pinned yet"),
        ({"edge-1": nis(entry(NEW)), "edge-2": nis()}, "does not hold it"),
        ({"edge-1": nis(entry(NEW)), "edge-2": {"status": "junk"}}, "holds no release"),
    ],
)
def test_a_node_not_ready_holds_the_start_back_and_is_named(
    statuses: dict[str, Any], words: str
) -> None:
    decision = decide(cv(), NODES, statuses, [held("4.17.0", NEW)])
    assert (decision.reason, decision.release) == ("SiteNotReady", None)
    assert words in decision.message and "1 of 2 nodes" in decision.message


def test_a_release_that_does_not_upgrade_from_the_cluster_is_not_started() -> None:
    statuses = {n: nis(entry(NEW, reason="ReleaseNotAnUpgrade")) for n in NODES}
    decision = decide(cv(), NODES, statuses, [held("4.17.0", NEW)])
    assert decision.reason == "ReleaseNotAnUpgrade" and decision.release is None


def test_an_older_or_the_same_release_is_never_proposed() -> None:
    statuses = {n: nis(entry(NEW), entry(OLD)) for n in NODES}
    decision = decide(cv(), NODES, statuses, [held("4.16.2", NEW), held("4.16.3", OLD)])
    assert decision.reason == "NoReleaseToStart"


def test_the_newest_ready_release_is_chosen() -> None:
    statuses = {"edge-1": nis(entry(NEW), entry(NEWER)), "edge-2": nis(entry(NEW))}
    decision = decide(cv(), NODES, statuses, [held("4.17.0", NEW), held("4.17.2", NEWER)])
    assert decision.release is not None and decision.release.version == "4.17.0"
    statuses["edge-2"] = nis(entry(NEW), entry(NEWER))
    decision = decide(cv(), NODES, statuses, [held("4.17.0", NEW), held("4.17.2", NEWER)])
    assert decision.release is not None and decision.release.version == "4.17.2"


def test_an_update_running_or_asked_for_is_left_alone() -> None:
    asked = cv(desired_update={"image": f"{REPO}@{NEWER}"})
    assert decide(asked, NODES, READY, [held("4.17.0", NEW)]).reason == "UpgradeInProgress"
    running = cv(state="Partial")
    assert decide(running, NODES, READY, [held("4.17.0", NEW)]).reason in (
        "UpgradeInProgress",
        "ClusterVersionUnknown",
    )
    same = cv(desired_update={"image": f"{REPO}@{OLD}"})
    assert decide(same, NODES, READY, [held("4.17.0", NEW)]).reason == "SiteReady"


def test_no_nodes_known_is_not_ready() -> None:
    decision = decide(cv(), [], READY, [held("4.17.0", NEW)])
    assert decision.reason == "SiteNotReady" and "no Node" in decision.message


def test_odd_cluster_versions_give_a_reason_code() -> None:
    assert decide(None, NODES, READY, []).reason == "ClusterVersionUnknown"
    odd = cv()
    odd["status"]["history"][0]["version"] = "4.16"
    assert decide(odd, NODES, READY, [held("4.17.0", NEW)]).reason == "ReleaseVersionInvalid"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(junk=_json)
def test_junk_statuses_never_start_and_never_raise(junk: object) -> None:
    statuses: dict[str, Any] = {"edge-1": nis(entry(NEW)), "edge-2": {"status": junk}}
    decision = decide(cv(), NODES, statuses, [held("4.17.0", NEW)])
    assert decision.reason in ("SiteNotReady", "ReleaseNotAnUpgrade")


def test_a_node_lease_is_fresh_only_within_its_duration() -> None:
    now = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)

    def lease(renewed: object, duration: object = 40) -> dict[str, Any]:
        return {"spec": {"renewTime": renewed, "leaseDurationSeconds": duration}}

    assert lease_is_fresh(lease("2026-11-28T11:59:30.000000Z"), now)
    assert not lease_is_fresh(lease("2026-11-28T11:59:10.000000Z"), now)
    for odd in (
        lease(None),
        lease("yesterday"),
        lease("2026-11-28T11:59:30"),  # no zone: not guessed
        lease("2026-11-28T11:59:30Z", "40"),
        lease("2026-11-28T11:59:30Z", 0),
        {"spec": "junk"},
        {},
    ):
        assert not lease_is_fresh(odd, now)


def test_count_ready_counts_clean_pins_and_this_node() -> None:
    statuses = {
        "edge-1": nis(entry(NEW)),
        "edge-2": nis(entry(NEW, pinned=False)),
        "edge-3": nis(entry(NEW, reason="ReleaseNotAnUpgrade")),
    }
    nodes = ["edge-1", "edge-2", "edge-3", "edge-4"]
    # edge-4 has no status yet but is this node: it knows itself ready before its status says
    assert count_ready(NEW, nodes, statuses, this_node="edge-4") == (2, 4)
    assert count_ready(NEW, nodes, statuses, this_node="edge-2") == (2, 4)
    assert count_ready(OLD, nodes, statuses, this_node="edge-5") == (1, 5)
