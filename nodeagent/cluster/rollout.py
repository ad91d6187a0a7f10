"""Where the cluster's upgrade stands, for retiring old releases (pure; issue 26 item 5).

ClusterVersion (``config.openshift.io/v1``, docs/runtime-facts.md) says ``Completed`` in
``status.history[0]`` once the cluster-version operator has applied the release's
manifests, before the worker pools have finished rolling out, and an EUS upgrade pauses
pools on purpose. So a release has finished only when, as well:

* every MachineConfigPool is updated: conditions ``Updated=True`` and ``Updating=False``,
  ``status.machineCount == status.updatedMachineCount``, and (when both are set)
  ``status.observedGeneration`` equals ``metadata.generation``;
* and none is paused (``spec.paused``).

``rollout`` reads both strictly and answers either a ``Rollout`` (finished, with the
releases that must never be touched) or a ``Waiting`` with a reason code. Nothing is
guessed: a missing or odd field is a reason code, never "finished".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.strict import clip, quoted

MAX_POOLS: Final = 256
"""MachineConfigPools judged; more is refused as odd input (a cluster has a handful)."""
MAX_HISTORY: Final = 100
"""ClusterVersion keeps at most 100 history entries (openshift/api)."""
_DIGEST: Final = re.compile(r"@(sha256:[a-f0-9]{64})$")
_VERSION_CHARS: Final = 64

CLUSTER_VERSION_INVALID: Final = "ClusterVersionInvalid"
UPGRADE_NOT_COMPLETED: Final = "UpgradeNotCompleted"
UPGRADE_REQUESTED: Final = "UpgradeRequested"
POOLS_UNKNOWN: Final = "PoolsUnknown"
POOL_NOT_UPDATED: Final = "PoolNotUpdated"
POOL_PAUSED: Final = "PoolPaused"


@dataclass(frozen=True, slots=True)
class Release:
    """A release as ClusterVersion names it: its version and image digest (either may be
    unknown, ``""``)."""

    version: str
    digest: str

    def describe(self) -> str:
        return quoted(self.version or self.digest or "?", _VERSION_CHARS)


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


def _invalid(what: str) -> Waiting:
    return Waiting(CLUSTER_VERSION_INVALID, f"ClusterVersion: {what}")


def _release(value: object) -> Release | None:
    """``{version, image}`` (history entry, ``status.desired``, ``spec.desiredUpdate``)."""
    if not isinstance(value, Mapping):
        return None
    version, image = value.get("version", ""), value.get("image", "")
    if not isinstance(version, str) or not isinstance(image, str):
        return None
    found = _DIGEST.search(image)
    if image and found is None:
        return None  # an image not named by digest cannot be compared
    release = Release(version[:_VERSION_CHARS], found[1] if found else "")
    return release if release.version or release.digest else None


def is_same(a: Release, b: Release) -> bool:
    """By digest when both know it, else by version."""
    if a.digest and b.digest:
        return a.digest == b.digest
    return bool(a.version) and a.version == b.version


def _completed(cv: Mapping[str, Any] | None) -> Rollout | Waiting:
    if cv is None:
        return Waiting(CLUSTER_VERSION_INVALID, "no ClusterVersion 'version' is known yet")
    spec, status = cv.get("spec"), cv.get("status")
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        return _invalid("spec or status is missing")
    history = status.get("history")
    if not isinstance(history, list) or not 1 <= len(history) <= MAX_HISTORY:
        return _invalid(f"status.history must list 1 to {MAX_HISTORY} entries")
    newest, desired = _release(history[0]), _release(status.get("desired"))
    if newest is None or desired is None:
        return _invalid("status.history[0] or status.desired has no version or image digest")
    state = history[0].get("state")
    if state != "Completed":
        return Waiting(
            UPGRADE_NOT_COMPLETED,
            f"the upgrade to {newest.describe()} is {quoted(state, 40)}, not Completed",
        )
    if not is_same(newest, desired):
        return Waiting(UPGRADE_NOT_COMPLETED, f"the cluster is moving to {desired.describe()}")
    requested = spec.get("desiredUpdate")
    protected = [newest, desired]
    if requested is not None:
        asked = _release(requested)
        if asked is None:
            return _invalid("spec.desiredUpdate has no version or image digest")
        if not is_same(asked, newest):
            return Waiting(UPGRADE_REQUESTED, f"an upgrade to {asked.describe()} is requested")
        protected.append(asked)
    if _generation_ahead(cv, status):
        return Waiting(UPGRADE_REQUESTED, "the cluster-version operator has not read the spec yet")
    previous = _release(history[1]) if len(history) > 1 else None
    return Rollout(newest, previous, tuple(protected))


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
