"""Which release bundles to retire once an upgrade has finished (pure; issue 26 item 5).

A node holds release bundles (``bundle create --release``), each pinning its release set.
Once the cluster's upgrade has finished everywhere (``rollout.Rollout``: ClusterVersion
``Completed`` and every MachineConfigPool updated and unpaused), ``plan`` keeps:

* the current release, the desired one and a requested one (never retired);
* the release before it (``status.history[1]``) and, in all, the newest
  ``keep_releases`` release versions at or below the current one;
* every release newer than the current one (carried for a later upgrade);
* every release whose version is not semantic (``ReleaseVersionInvalid``): it cannot be
  ordered, so it is never retired.

The rest is retired: its set is unpinned, and the store collects its blobs after the grace
period (``store.keeping``); its signed manifest and signatures stay (the anti-rollback
marks are derived from them). While the rollout has not finished, nothing is retired and
the plan carries the reason code of ``rollout``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from nodeagent.cluster.clusterversion import Release, parse_semver
from nodeagent.cluster.rollout import (
    UPGRADE_NOT_COMPLETED,
    UPGRADE_REQUESTED,
    Rollout,
    Waiting,
    describe,
    is_same,
)
from nodeagent.releases import HeldRelease
from nodeagent.strict import quoted

RELEASE_VERSION_INVALID: Final = "ReleaseVersionInvalid"
RELEASES_RETIRED: Final = "ReleasesRetired"
NOTHING_TO_RETIRE: Final = "NothingToRetire"
RELEASE_IN_USE: Final = "ReleaseInUse"
RELEASE_STATE_UNKNOWN: Final = "ReleaseStateUnknown"

_MAX_VERSION_CHARS: Final = 64

Keep = Literal["current", "previous", "newer", "kept", "invalid", "waiting", "retire"]
_PreKey = tuple[tuple[int, int, str], ...]
SemverKey = tuple[int, int, int, int, _PreKey]


def semver_key(version: str) -> SemverKey | None:
    """A sort key in semantic-version precedence (``clusterversion.compare_versions``'s
    order); None: not a semantic version (build metadata is ignored, as precedence does)."""
    parsed = parse_semver(version)
    if parsed is None:
        return None
    pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parsed.prerelease)
    return (parsed.major, parsed.minor, parsed.patch, 0 if pre else 1, pre)


@dataclass(frozen=True, slots=True)
class Verdict:
    held: HeldRelease
    keep: Keep


@dataclass(frozen=True, slots=True)
class Plan:
    reason: str
    message: str
    verdicts: tuple[Verdict, ...] = ()

    @property
    def retire(self) -> tuple[HeldRelease, ...]:
        """The releases to unpin now (pinned, and judged ``retire``)."""
        return tuple(v.held for v in self.verdicts if v.keep == "retire" and v.held.is_pinned)


def plan(state: Rollout | Waiting, held: Iterable[HeldRelease], keep_releases: int) -> Plan:
    """What to retire of ``held``; ``keep_releases`` is at least 2 (``[upgrade]``)."""
    releases = sorted(held, key=lambda h: h.bundle_id)
    if isinstance(state, Waiting):
        return Plan(state.reason, state.message, tuple(Verdict(h, "waiting") for h in releases))
    current_key = semver_key(state.current.version)
    if current_key is None:
        message = f"the cluster's version {describe(state.current)} is not a semantic version"
        return Plan(
            RELEASE_VERSION_INVALID, message, tuple(Verdict(h, "invalid") for h in releases)
        )
    verdicts = {h: _first_look(h, state, current_key) for h in releases}
    older = sorted(
        {h.version for h, keep in verdicts.items() if keep == "retire"},
        key=lambda v: semver_key(v) or (0, 0, 0, 0, ()),
        reverse=True,
    )
    slots = max(keep_releases - 1 - _previous_held(verdicts), 0)
    kept_versions = set(older[:slots])
    result = tuple(
        Verdict(h, "kept" if keep == "retire" and h.version in kept_versions else keep)
        for h, keep in verdicts.items()
    )
    return _summary(result, state)


def _first_look(held: HeldRelease, state: Rollout, current_key: SemverKey) -> Keep:
    release = Release(held.version, "", held.digest)
    if any(is_same(release, p) for p in state.protected) or held.version == state.current.version:
        return "current"
    if state.previous is not None and is_same(release, state.previous):
        return "previous"
    key = semver_key(held.version)
    if key is None:
        return "invalid"
    return "newer" if key > current_key else "retire"


def _previous_held(verdicts: dict[HeldRelease, Keep]) -> int:
    """1 when the release before the current one is held (it takes one slot), else 0."""
    return 1 if "previous" in verdicts.values() else 0


def _summary(verdicts: tuple[Verdict, ...], state: Rollout) -> Plan:
    retired = [v.held for v in verdicts if v.keep == "retire" and v.held.is_pinned]
    invalid = [v.held for v in verdicts if v.keep == "invalid"]
    notes = ""
    if invalid:
        notes = "; kept, not a semantic version: " + ", ".join(
            quoted(h.version, _MAX_VERSION_CHARS) for h in invalid
        )
    current = describe(state.current)
    if not retired:
        message = f"the cluster runs {current} on every pool; no older release to retire{notes}"
        return Plan(NOTHING_TO_RETIRE, message, verdicts)
    names = ", ".join(f"{quoted(h.version, _MAX_VERSION_CHARS)} ({h.bundle_id})" for h in retired)
    message = f"the cluster runs {current} on every pool; retiring {names}{notes}"
    return Plan(RELEASES_RETIRED, message, verdicts)


_KEPT_WORDS: Final = {"current": "current", "previous": "previous", "kept": "kept",
                      "newer": "newer, for the next upgrade"}  # fmt: skip


def space_note(result: Plan | None) -> str:
    """What holds the disk for a release bundle refused for space: the releases kept pinned
    and when an older one goes (``""`` when no release is held)."""
    if result is None or not result.verdicts:
        return ""
    kept = [
        f"{quoted(v.held.version, _MAX_VERSION_CHARS)} ({_KEPT_WORDS[v.keep]})"
        for v in result.verdicts
        if v.keep in _KEPT_WORDS and v.held.is_pinned
    ]
    if not kept:
        return ""
    why = "" if result.reason in (RELEASES_RETIRED, NOTHING_TO_RETIRE) else f" ({result.reason})"
    return (
        f"release bundles kept pinned: {', '.join(kept)}; an older release is unpinned only "
        f"once an upgrade past it has completed on every pool{why} (docs/upgrade.md, "
        '"Single node, one disk")'
    )


def by_hand(state: Rollout | Waiting, held: HeldRelease) -> tuple[str, str] | None:
    """Whether a technician may unpin ``held`` (or remove its blobs) now: None, or the reason
    code and message of a refusal (decision 0072). The rules are retirement's: never the
    current, desired or requested release, and nothing while an upgrade is under way or
    its state is not known; unlike retirement, an older release kept by ``keep_releases``,
    the previous one and a newer one may go (the technician decided)."""
    name = f"release {quoted(held.version, _MAX_VERSION_CHARS)} ({held.bundle_id})"
    if isinstance(state, Waiting):
        if state.reason in (UPGRADE_NOT_COMPLETED, UPGRADE_REQUESTED):
            return RELEASE_IN_USE, f"{name}: {state.message}; nothing is unpinned meanwhile"
        return RELEASE_STATE_UNKNOWN, (
            f"{name}: the upgrade is not known to have finished everywhere: {state.message}"
        )
    if _first_look(held, state, semver_key(state.current.version) or (0, 0, 0, 0, ())) == (
        "current"
    ):
        return RELEASE_IN_USE, (
            f"{name} is the cluster's current, desired or requested release "
            f"(the cluster runs {describe(state.current)})"
        )
    return None
