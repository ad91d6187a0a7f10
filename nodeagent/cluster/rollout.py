"""Where the cluster's upgrade stands, for retiring old releases (pure; issue 26 item 5).

ClusterVersion (``config.openshift.io/v1``, docs/runtime-facts.md) says ``Completed`` in
``status.history[0]`` once the cluster-version operator has applied the release's
manifests, before the worker pools have finished rolling out, and an EUS upgrade pauses
pools on purpose. So a release has finished only when, as well:

* every MachineConfigPool is updated: conditions ``Updated=True`` and ``Updating=False``,
  ``status.machineCount == status.updatedMachineCount``, and (when both are set)
  ``status.observedGeneration`` equals ``metadata.generation``;
* and none is paused (``spec.paused``).

``rollout`` reads both strictly (ClusterVersion through
``clusterversion.parse_cluster_version``) and answers either a ``Rollout`` (finished, with the
releases that must never be touched) or a ``Waiting`` with a reason code. Nothing is
guessed: a missing or odd field is a reason code, never "finished".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.cluster.clusterversion import (
    MAX_VERSION_CHARS,
    REASON_INVALID,
    ClusterVersionView,
    Release,
    parse_cluster_version,
)
from nodeagent.strict import clip, quoted

MAX_POOLS: Final = 256
"""MachineConfigPools judged; more is refused as odd input (a cluster has a handful)."""

UPGRADE_NOT_COMPLETED: Final = "UpgradeNotCompleted"
UPGRADE_REQUESTED: Final = "UpgradeRequested"
POOLS_UNKNOWN: Final = "PoolsUnknown"
POOL_NOT_UPDATED: Final = "PoolNotUpdated"
POOL_PAUSED: Final = "PoolPaused"


def describe(release: Release) -> str:
    return quoted(release.version or release.digest or "?", MAX_VERSION_CHARS)


@dataclass(frozen=True, slots=True)
class Rollout:
    """The cluster runs ``current`` everywhere: its upgrade completed, every pool updated."""

    current: Release
    previous: Release | None
    """``status.history[1]``: the release before (None on a cluster never upgraded)."""
    protected: tuple[Release, ...]
    """Never retired: the current, desired and requested releases."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """Not finished (or not known to be): nothing is retired."""

    reason: str
    message: str


def rollout(
    cluster_version: Mapping[str, Any] | None, pools: Iterable[Mapping[str, Any]] | None
) -> Rollout | Waiting:
    """Whether the cluster's upgrade has finished on every pool (``pools`` None: the
    MachineConfigPool API is not served or not listed yet)."""
    state = _completed(cluster_version)
    if isinstance(state, Waiting):
        return state
    waiting = _pools_waiting(pools)
    return waiting if waiting is not None else state


def is_same(a: Release, b: Release) -> bool:
    """By digest when both know it, else by version."""
    if a.digest and b.digest:
        return a.digest == b.digest
    return bool(a.version) and a.version == b.version


def _completed(cv: Mapping[str, Any] | None) -> Rollout | Waiting:
    if cv is None:
        return Waiting(REASON_INVALID, "no ClusterVersion 'version' is known yet")
    view = parse_cluster_version(cv)
    if not view.is_usable:
        first = view.problems[0]
        more = f" (and {len(view.problems) - 1} more)" if len(view.problems) > 1 else ""
        return Waiting(first.reason, f"ClusterVersion: {first.message}{more}")
    newest, desired = (view.history[0].release if view.history else None), view.desired
    if newest is None or desired is None or not (newest.version or newest.digest):
        return Waiting(REASON_INVALID, "ClusterVersion: no status.history or status.desired")
    if view.is_updating or not is_same(newest, desired):
        moving = newest if view.is_updating else desired
        return Waiting(
            UPGRADE_NOT_COMPLETED, f"the upgrade to {describe(moving)} is not Completed yet"
        )
    requested = _requested(view, cv, newest)
    if isinstance(requested, Waiting):
        return requested
    previous = view.history[1].release if len(view.history) > 1 else None
    return Rollout(newest, previous, (newest, desired, *requested))


def _requested(
    view: ClusterVersionView, cv: Mapping[str, Any], current: Release
) -> tuple[Release, ...] | Waiting:
    """``spec.desiredUpdate`` when it names the current release (protected too); an upgrade
    asked for, or a spec the operator has not read yet, waits."""
    asked = view.desired_update
    requested = () if asked is None else (Release(asked.version, asked.image, asked.digest),)
    if requested and not is_same(requested[0], current):
        return Waiting(UPGRADE_REQUESTED, f"an upgrade to {describe(requested[0])} is requested")
    if _generation_ahead(cv, cv.get("status") or {}):
        return Waiting(UPGRADE_REQUESTED, "the cluster-version operator has not read the spec yet")
    return requested


def _generation_ahead(obj: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    metadata = obj.get("metadata")
    generation = metadata.get("generation") if isinstance(metadata, Mapping) else None
    observed = status.get("observedGeneration")
    if type(generation) is int and type(observed) is int:
        return observed < generation
    return False


def _pools_waiting(pools: Iterable[Mapping[str, Any]] | None) -> Waiting | None:
    if pools is None:
        return Waiting(POOLS_UNKNOWN, "the MachineConfigPools are not known (not listed yet)")
    listed = list(pools)
    if not 1 <= len(listed) <= MAX_POOLS:
        return Waiting(POOLS_UNKNOWN, f"{len(listed)} MachineConfigPools (1 to {MAX_POOLS})")
    for pool in sorted(listed, key=_pool_name):
        waiting = _pool_waiting(pool)
        if waiting is not None:
            return waiting
    return None


def _pool_name(pool: Mapping[str, Any]) -> str:
    metadata = pool.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else ""


def _pool_waiting(pool: Mapping[str, Any]) -> Waiting | None:
    name = quoted(_pool_name(pool) or "?", 80)
    spec, status = pool.get("spec"), pool.get("status")
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        return Waiting(POOL_NOT_UPDATED, f"MachineConfigPool {name} has no spec or status")
    if spec.get("paused", False) is not False:
        return Waiting(POOL_PAUSED, f"MachineConfigPool {name} is paused")
    conditions = _conditions(status.get("conditions"))
    total, updated = status.get("machineCount"), status.get("updatedMachineCount")
    counts_known = type(total) is int and type(updated) is int
    if conditions.get("Updated") != "True" or conditions.get("Updating") != "False":
        return Waiting(POOL_NOT_UPDATED, f"MachineConfigPool {name} is not Updated")
    if not counts_known or total != updated:
        return Waiting(
            POOL_NOT_UPDATED,
            f"MachineConfigPool {name}: {clip(updated, 12)} of {clip(total, 12)} machines updated",
        )
    if _generation_ahead(pool, status):
        return Waiting(POOL_NOT_UPDATED, f"MachineConfigPool {name} has a newer spec to roll out")
    return None


def _conditions(value: object) -> dict[str, str]:
    """``type`` → ``status`` of a conditions list (a malformed item is skipped, so a missing
    condition stays missing: never read as its good value)."""
    found: dict[str, str] = {}
    for item in value[:64] if isinstance(value, list) else ():
        if isinstance(item, Mapping):
            kind, state = item.get("type"), item.get("status")
            if isinstance(kind, str) and isinstance(state, str):
                found[kind] = state
    return found
