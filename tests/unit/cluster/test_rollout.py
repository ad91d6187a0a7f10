"""cluster.rollout: when an upgrade has finished on every pool, read strictly."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.cluster.clusterversion import Release
from nodeagent.cluster.rollout import Rollout, Waiting, rollout

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
D3 = "sha256:" + "3" * 64
T = "2026-11-28T10:00:00Z"


def image(digest: str) -> str:
    return f"quay.io/openshift-release-dev/ocp-release@{digest}"


def cluster_version(
    *, state: str = "Completed", desired_update: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "version", "generation": 3},
        "spec": {"clusterID": "x", **({"desiredUpdate": desired_update} if desired_update else {})},
        "status": {
            "observedGeneration": 3,
            "desired": {"version": "4.16.2", "image": image(D2)},
            "history": [
                {"state": state, "version": "4.16.2", "image": image(D2), "startedTime": T},
                {"state": "Completed", "version": "4.16.1", "image": image(D1), "startedTime": T},
            ],
        },
    }


def pool(name: str, **changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "generation": 2},
        "spec": {"paused": False},
        "status": {
            "observedGeneration": 2,
            "machineCount": 3,
            "updatedMachineCount": 3,
            "conditions": [
                {"type": "Updated", "status": "True"},
                {"type": "Updating", "status": "False"},
                {"type": "Degraded", "status": "False"},
            ],
        },
    }
    for path, value in changes.items():
        section, key = path.split("__")
        obj[section][key] = value
    return obj


POOLS = [pool("master"), pool("worker")]


def test_completed_and_every_pool_updated_is_finished() -> None:
    state = rollout(cluster_version(), POOLS)
    current = Release("4.16.2", image(D2), D2)
    assert state == Rollout(current, Release("4.16.1", image(D1), D1), (current, current))


def test_partial_is_not_finished() -> None:
    state = rollout(cluster_version(state="Partial"), POOLS)
    assert isinstance(state, Waiting) and state.reason == "UpgradeNotCompleted"
    assert "not Completed" in state.message


def test_completed_but_a_worker_pool_still_rolling_out_is_not_finished() -> None:
    rolling = pool("worker", status__updatedMachineCount=1)
    state = rollout(cluster_version(), [pool("master"), rolling])
    assert isinstance(state, Waiting) and state.reason == "PoolNotUpdated"
    assert "1 of 3 machines" in state.message


def test_a_paused_pool_holds_retirement_back_as_an_eus_upgrade_does() -> None:
    state = rollout(cluster_version(), [pool("master"), pool("worker", spec__paused=True)])
    assert isinstance(state, Waiting) and state.reason == "PoolPaused"


@pytest.mark.parametrize(
    "conditions",
    [
        [{"type": "Updated", "status": "True"}],
        [{"type": "Updated", "status": "False"}, {"type": "Updating", "status": "True"}],
        [{"type": "Updated", "status": "True"}, {"type": "Updating", "status": "True"}],
        "nonsense",
    ],
)
def test_pool_conditions_must_say_updated_and_not_updating(conditions: object) -> None:
    state = rollout(cluster_version(), [pool("worker", status__conditions=conditions)])
    assert isinstance(state, Waiting) and state.reason == "PoolNotUpdated"


def test_a_pool_spec_not_yet_observed_is_not_updated() -> None:
    state = rollout(cluster_version(), [pool("worker", status__observedGeneration=1)])
    assert isinstance(state, Waiting) and state.reason == "PoolNotUpdated"


def test_no_pools_known_is_not_zero_pools_done() -> None:
    nothing: list[dict[str, Any]] = []
    for pools in (None, nothing):
        state = rollout(cluster_version(), pools)
        assert isinstance(state, Waiting) and state.reason == "PoolsUnknown"


def test_a_requested_update_to_another_release_waits() -> None:
    cv = cluster_version(desired_update={"version": "4.17.0", "image": image(D3)})
    state = rollout(cv, POOLS)
    assert isinstance(state, Waiting) and state.reason == "UpgradeRequested"


def test_a_requested_update_to_the_current_release_is_protected() -> None:
    cv = cluster_version(desired_update={"version": "4.16.2", "image": image(D2), "force": False})
    state = rollout(cv, POOLS)
    assert isinstance(state, Rollout) and len(state.protected) == 3


def test_a_spec_the_operator_has_not_read_waits() -> None:
    cv = cluster_version()
    cv["metadata"]["generation"] = 4
    state = rollout(cv, POOLS)
    assert isinstance(state, Waiting) and state.reason == "UpgradeRequested"


def test_the_operator_moving_to_another_desired_release_waits() -> None:
    cv = cluster_version()
    cv["status"]["desired"] = {"version": "4.17.0", "image": image(D3)}
    state = rollout(cv, POOLS)
    assert isinstance(state, Waiting) and state.reason == "UpgradeNotCompleted"


def test_a_cluster_never_upgraded_has_no_previous_release() -> None:
    cv = cluster_version()
    del cv["status"]["history"][1]
    state = rollout(cv, POOLS)
    assert isinstance(state, Rollout) and state.previous is None


@pytest.mark.parametrize(
    "mutate",
    [
        lambda cv: cv.pop("status"),
        lambda cv: cv["status"].pop("history"),
        lambda cv: cv["status"].__setitem__("history", []),
        lambda cv: cv["status"].__setitem__("history", ["Completed"]),
        lambda cv: cv["status"].pop("desired"),
        lambda cv: cv["status"]["history"][0].__setitem__("version", 4.16),
        lambda cv: cv["status"]["history"][0].__setitem__("state", "Done"),
        lambda cv: cv["spec"].__setitem__("desiredUpdate", {"channel": "x"}),
        lambda cv: cv.__setitem__("spec", None),
    ],
)
def test_odd_cluster_versions_give_a_reason_code(mutate: Any) -> None:
    cv = cluster_version()
    mutate(cv)
    state = rollout(cv, POOLS)
    assert isinstance(state, Waiting) and state.reason == "ClusterVersionInvalid"


def test_a_cluster_version_that_is_not_semver_gives_its_reason_code() -> None:
    cv = cluster_version()
    cv["status"]["desired"]["version"] = "4.16"
    state = rollout(cv, POOLS)
    assert isinstance(state, Waiting) and state.reason == "ReleaseVersionInvalid"


def test_no_cluster_version_is_a_reason_code() -> None:
    state = rollout(None, POOLS)
    assert isinstance(state, Waiting) and state.reason == "ClusterVersionInvalid"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(junk=_json, where=st.sampled_from(["spec", "status", "history0", "desired", "pool"]))
def test_any_junk_in_any_field_gives_a_result_never_a_traceback(junk: object, where: str) -> None:
    cv = copy.deepcopy(cluster_version())
    pools = [pool("master"), pool("worker")]
    if where == "spec":
        cv["spec"] = junk
    elif where == "status":
        cv["status"] = junk
    elif where == "history0":
        cv["status"]["history"][0] = junk
    elif where == "desired":
        cv["status"]["desired"] = junk
    else:
        pools[1] = {"metadata": junk, "spec": junk, "status": junk}
    state = rollout(cv, pools)
    assert isinstance(state, Rollout | Waiting)
    if isinstance(state, Waiting):
        assert state.reason and state.message
