"""The OpenShift releases a node holds and has pinned (pure): ``status.releases`` of its
NodeImageStatus, which deploy/upgrade-gate.yaml reads, and the rows of the release metrics.

A release is held when the node's store holds a bundle that carries it (``HeldRelease``,
read by ``adapters.store.releases``, the one reader for the status and for retirement) or a
bundle that carries it was imported in this run (``BundleReport.release``); it is pinned
when its PinnedImageSet is ``Pinned`` in the node's last sync (every image of the set pinned
in the runtime). ``release_report`` judges the upgrade path against the cluster's version
(decision 0066). At most ``MAX_RELEASES`` entries (the CRD's bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from nodeagent.status import NodeStatus, ReleaseReport
from nodeagent.strict import clip
from nodeagent.versions import REASON_NOT_AN_UPGRADE, REASON_VERSION, check_upgrade_path

MAX_RELEASES: Final = 20
"""``status.releases`` maxItems."""
MAX_MESSAGE_CHARS: Final = 512


@dataclass(frozen=True, slots=True)
class HeldRelease:
    """A release bundle the node's store holds (its verified ``bundle.json``)."""

    bundle_id: str
    version: str
    digest: str
    """The release image's digest, ``sha256:<hex>``."""
    set_name: str
    is_pinned: bool = True
    """Its set file is still in a spec directory (False: retired before, or unpinned)."""
    image: str = ""
    """The release image's pull spec by digest (``bundle.json``'s ``release.image``)."""
    previous: tuple[str, ...] = ()
    """The versions it upgrades from (``release.previous``; decision 0066)."""


@dataclass(frozen=True, slots=True)
class ReleaseRow:
    version: str
    digest: str
    set_name: str
    is_pinned: bool
    is_upgrade: bool
    reason: str = ""
    message: str = ""


def release_report(
    version: str, digest: str, set_name: str, previous: Sequence[str], current: str | None
) -> ReleaseReport:
    """A carried release and the upgrade-path verdict against the cluster's version
    (``current``; None or empty: not known, nothing judged)."""
    report = ReleaseReport(version, digest, set_name)
    if not current:
        return report
    verdict = check_upgrade_path(current, version, tuple(previous))
    report = replace(report, cluster_version=current, is_upgrade=verdict.is_upgrade)
    if verdict.reason not in (REASON_NOT_AN_UPGRADE, REASON_VERSION):
        return report
    return replace(report, path_reason=verdict.reason, path_message=verdict.message)


def release_reports(held: Iterable[HeldRelease], current: str | None) -> tuple[ReleaseReport, ...]:
    """``status.releases``: one report per release digest the store holds, judged against the
    cluster's version (``current``), at most ``MAX_RELEASES`` (the newest records kept)."""
    found = {
        h.digest: release_report(h.version, h.digest, h.set_name, h.previous, current) for h in held
    }
    return tuple(found.values())[-MAX_RELEASES:]


def release_rows(status: NodeStatus) -> tuple[ReleaseRow, ...]:
    """One row per release digest: those the node's store holds (``status.releases``, judged
    against the cluster's version of now), then those of bundles this run imported that the
    store does not hold (no store, say)."""
    pinned = {s.name for s in status.sets if s.state == "Pinned"}
    found: dict[str, ReleaseReport] = {r.digest: r for r in status.releases}
    for report in status.bundles:
        if report.release is not None and report.state in ("imported", "pinned"):
            found.setdefault(report.release.digest, report.release)
    rows = [
        ReleaseRow(
            r.version, r.digest, r.set_name, r.set_name in pinned, r.is_upgrade,
            r.path_reason, r.path_message,
        )
        for r in found.values()
    ]  # fmt: skip
    return tuple(rows[-MAX_RELEASES:])


def pinned_digests(status: NodeStatus | None) -> frozenset[str]:
    """Digests of the releases whose set is pinned on the node."""
    if status is None:
        return frozenset()
    return frozenset(row.digest for row in release_rows(status) if row.is_pinned)


def releases_json(rows: Sequence[ReleaseRow]) -> list[dict[str, Any]]:
    """``status.releases`` as the CRD wants it."""
    items = []
    for row in rows:
        item: dict[str, Any] = {
            "digest": row.digest,
            "version": row.version,
            "set": row.set_name,
            "pinned": row.is_pinned,
        }
        if row.reason:
            message = row.message
            if len(message) > MAX_MESSAGE_CHARS or not message.isprintable():
                message = clip(message, MAX_MESSAGE_CHARS - 32)
            item |= {"reason": row.reason, "message": message}
        items.append(item)
    return items


# ---------------------------------------------------------------- the site, as a node knows it
@dataclass(frozen=True, slots=True)
class SiteReadiness:
    """How many nodes have pinned a release, as this node can see it (decision 0073)."""

    ready: int
    nodes: int
    source: str
    """Where the count comes from, for the reader: ``"NodeImageStatuses"``."""


SITE_UNKNOWN: Final = (
    "how many other nodes are ready is not known to this node (it may not list the other "
    "nodes' NodeImageStatuses: deploy/opt-in/upgrade-start.yaml grants it)"
)


def site_line(readiness: SiteReadiness | None) -> str:
    """'this node is ready; 2 of 3 nodes ready (NodeImageStatuses)', or why it cannot know."""
    if readiness is None:
        return f"this node is ready; {SITE_UNKNOWN}"
    return (
        f"this node is ready; {readiness.ready} of {readiness.nodes} nodes ready "
        f"({readiness.source})"
    )
