"""Whether to start the upgrade now, and to which release (pure; issue 26 item 7).

With ``[upgrade] start = "when-site-ready"`` the elected agent (``cluster.starting``) asks
``decide`` each time the ClusterVersion, the Nodes or their NodeImageStatuses change. It
starts an upgrade only when all of these hold:

* the ClusterVersion reads right (``clusterversion.parse_cluster_version``, no problem),
  no update runs and none is asked for (no ``desiredUpdate`` other than the current release);
* this node holds a release bundle newer than the cluster's version (a downgrade is never
  proposed);
* every Node has a NodeImageStatus that lists that release (by digest) ``pinned: true``
  with no reason: the upgrade-path check (``ReleaseNotAnUpgrade``) passed on every node.

A release bundle is for the whole cluster (an upgrade rolls out to every node), so its
scope is every Node. Among several ready releases the newest is chosen. Every other case
is a reason code with a message; nothing is guessed (a Node without a status is not ready).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.cluster.clusterversion import (
    SemVer,
    compare_versions,
    parse_cluster_version,
    parse_semver,
)
from nodeagent.cluster.retirement import semver_key
from nodeagent.releases import HeldRelease
from nodeagent.strict import quoted

SITE_READY: Final = "SiteReady"
SITE_NOT_READY: Final = "SiteNotReady"
UPGRADE_IN_PROGRESS: Final = "UpgradeInProgress"
NO_RELEASE_TO_START: Final = "NoReleaseToStart"
NOT_AN_UPGRADE: Final = "ReleaseNotAnUpgrade"
CLUSTER_VERSION_UNKNOWN: Final = "ClusterVersionUnknown"
MAX_NAMED_NODES: Final = 5
"""Nodes named in a message; the count says how many in all."""


@dataclass(frozen=True, slots=True)
class StartDecision:
    reason: str
    message: str
    release: HeldRelease | None = None
    """The release to start (``reason`` is ``SiteReady``)."""
    current: str = ""
    nodes: int = 0


def decide(
    cluster_version: Mapping[str, Any] | None,
    nodes: Iterable[str],
    statuses: Mapping[str, Mapping[str, Any]],
    held: Sequence[HeldRelease],
) -> StartDecision:
    """The decision for this moment (see the module docstring)."""
    where = _where(cluster_version)
    if isinstance(where, StartDecision):
        return where
    version, now = where
    current = _Current(version, now)
    newer = [h for h in held if _is_newer(h.version, current.semver) and h.image]
    if not newer:
        return StartDecision(
            NO_RELEASE_TO_START,
            f"no release bundle newer than {quoted(current.text, 64)} is held here",
            current=current.text,
        )
    names = sorted(set(nodes))
    newer.sort(key=lambda h: semver_key(h.version) or (0, 0, 0, 0, ()), reverse=True)
    verdicts = [(h, _laggards(h, names, statuses)) for h in newer]
    for release, laggards in verdicts:
        if names and not laggards:
            return StartDecision(
                SITE_READY,
                f"every node ({len(names)}) has pinned release {quoted(release.version, 64)} "
                f"and it upgrades from {quoted(current.text, 64)}",
                release,
                current.text,
                len(names),
            )
    release, laggards = verdicts[0]
    reason = NOT_AN_UPGRADE if any(why == NOT_AN_UPGRADE for _, why in laggards) else SITE_NOT_READY
    named = ", ".join(f"{quoted(n, 64)} ({why})" for n, why in laggards[:MAX_NAMED_NODES])
    more = f" and {len(laggards) - MAX_NAMED_NODES} more" if len(laggards) > MAX_NAMED_NODES else ""
    message = (
        f"release {quoted(release.version, 64)}: {len(laggards)} of {len(names)} nodes not ready: "
        f"{named}{more}"
        if names
        else "no Node is known yet"
    )
    return StartDecision(reason, message, None, current.text, len(names))


@dataclass(frozen=True, slots=True)
class _Current:
    text: str
    semver: SemVer


def _where(cluster_version: Mapping[str, Any] | None) -> tuple[str, SemVer] | StartDecision:
    """The cluster's current version, or why there is nothing to decide."""
    if cluster_version is None:
        return StartDecision(CLUSTER_VERSION_UNKNOWN, "no ClusterVersion 'version' is known yet")
    view = parse_cluster_version(cluster_version)
    if not view.is_usable:
        first = view.problems[0]
        return StartDecision(first.reason, f"ClusterVersion: {first.message}")
    current = view.current
    now = parse_semver(current.version) if current is not None else None
    if current is None or now is None:
        return StartDecision(CLUSTER_VERSION_UNKNOWN, "the cluster's current version is not known")
    if view.is_updating or view.target_digests() - {current.digest}:
        return StartDecision(
            UPGRADE_IN_PROGRESS, "an update runs or is asked for already", current=current.version
        )
    return current.version, now


def _is_newer(version: str, current: SemVer) -> bool:
    parsed = parse_semver(version)
    return parsed is not None and compare_versions(parsed, current) > 0


def _laggards(
    release: HeldRelease, nodes: Sequence[str], statuses: Mapping[str, Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """``(node, why)`` for each node that has not pinned ``release`` cleanly."""
    found = []
    for node in nodes:
        why = _node_verdict(release, statuses.get(node))
        if why:
            found.append((node, why))
    return found


def count_ready(
    digest: str, nodes: Iterable[str], statuses: Mapping[str, Mapping[str, Any]], *, this_node: str
) -> tuple[int, int]:
    """(nodes that pinned the release of ``digest`` cleanly, all nodes): what a node says
    once it pinned the release itself (decision 0073). This node counts as ready: its own
    NodeImageStatus may not say so yet when it says it."""
    names = sorted({*nodes, this_node})
    held = HeldRelease("", "", digest, "")
    ready = sum(1 for n in names if n == this_node or not _node_verdict(held, statuses.get(n)))
    return ready, len(names)


def _node_verdict(release: HeldRelease, status_object: Mapping[str, Any] | None) -> str:
    if status_object is None:
        return "no status"
    status = status_object.get("status")
    entries = status.get("releases") if isinstance(status, Mapping) else None
    if not isinstance(entries, list):
        return "holds no release"
    for entry in entries[:100]:
        if isinstance(entry, Mapping) and entry.get("digest") == release.digest:
            reason = entry.get("reason")
            if isinstance(reason, str) and reason:
                return NOT_AN_UPGRADE if reason == NOT_AN_UPGRADE else quoted(reason, 64)
            return "" if entry.get("pinned") is True else "not pinned yet"
    return "does not hold it"
