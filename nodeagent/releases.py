"""The OpenShift releases a node holds and has pinned (pure): ``status.releases`` of its
NodeImageStatus, which deploy/upgrade-gate.yaml reads, and the rows of the release metrics.

A release is held when a bundle that carries it (``BundleReport.release``) was imported; it
is pinned when its PinnedImageSet is ``Pinned`` in the node's last sync (every image of the
set pinned in the runtime). The upgrade-path verdict is the one the import made against the
cluster's version of that moment (``bundles.importer``; decision 0065). At most
``MAX_RELEASES`` entries (the CRD's bound), by version order as the bundles came.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from nodeagent.status import NodeStatus, ReleaseReport
from nodeagent.strict import clip

MAX_RELEASES: Final = 20
"""``status.releases`` maxItems."""
MAX_MESSAGE_CHARS: Final = 512


@dataclass(frozen=True, slots=True)
class ReleaseRow:
    version: str
    digest: str
    set_name: str
    is_pinned: bool
    is_upgrade: bool
    reason: str = ""
    message: str = ""


def release_rows(status: NodeStatus) -> tuple[ReleaseRow, ...]:
    """One row per release digest the node's bundles carry (the newest report of each)."""
    pinned = {s.name for s in status.sets if s.state == "Pinned"}
    found: dict[str, ReleaseReport] = {}
    for report in status.bundles:
        if report.release is not None and report.state in ("imported", "pinned"):
            found[report.release.digest] = report.release
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
