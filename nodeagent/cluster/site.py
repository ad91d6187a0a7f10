"""The site view (pure): which Nodes hold, pin or fail a bundle, from their NodeImageStatus.

``bundle_view`` judges one bundle id (and, with ``set_name``, one of its PinnedImageSets)
on every Node in scope, from the Node objects and the NodeImageStatus objects as the API
server lists them; ``site_views`` does so for every bundle id any status mentions.
``nodeagent site status`` prints these views, ``nodeagent site wait`` polls until one is
complete (docs/cluster.md, "Site view").

* A Node with no NodeImageStatus is a laggard (``no-status``), never skipped: its agent
  never started, or cannot reach the API server.
* A node in progress (storing or importing the bundle, or its set Progressing) whose
  ``lastHeartbeatTime`` is older than ``stale_after_s`` is ``stale``: while it works the
  agent writes at least every ``heartbeat_s`` (pulls) or ``progress_interval_s`` (bytes
  moving), so it is dead or stuck. An idle agent writes only on change, so an old
  heartbeat on a node that is pinned, holds the bundle or lacks it is normal.
* "Different manifest for the same id": each node's published NodeImageHoldings
  (``holdings``) names the digest of the signed manifest it holds for the id; nodes whose
  digest differs from the most common one are named, and the bundle is not complete
  (``site wait`` does not open) while they do. For nodes that publish no holdings (an
  older agent) the image count their status reports is compared instead, as a hint.
* Every text taken from a status object (ids, reasons, messages, names) is clipped and
  escaped (``strict.clip``) here, before it reaches a terminal or JSON output.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nodeagent.cluster.holdings import (
    Holdings,
    bundle_ids_held,
    digest_conflicts,
    holders,
)
from nodeagent.cluster.site_view import HOLDING_STATES, BundleView, Conflict, NodeReport, Verdict
from nodeagent.selectors import Selector
from nodeagent.strict import clip

Obj = Mapping[str, Any]

NAME_CHARS = 253
"""A Node name's longest legal length; longer input is clipped."""
ID_CHARS = 200
REASON_CHARS = 128
MESSAGE_CHARS = 400

FAILING_STATES = frozenset({"rejected", "interrupted"})
FAILING_SET_STATES = frozenset({"Degraded", "Refused"})
_RANK = {
    "pinned": 9,
    "imported": 8,
    "importing": 7,
    "stored": 6,
    "storing": 5,
    "fetching": 5,
    "admitted": 4,
    "verified": 3,
    "detected": 2,
    "interrupted": 1,
    "rejected": 0,
}
"""Which of a node's entries for one id speaks for it: the furthest step reached."""
_COUNTED_STATES = frozenset(_RANK) - {"detected", "rejected"}
"""Entries whose image count comes from a verified manifest (compared for conflicts)."""


# ---------------------------------------------------------------- reading objects


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 0 else None


def _text(value: object, limit: int) -> str:
    return clip(value, limit) if isinstance(value, str) else ""


def name_of(obj: Obj) -> str:
    return _text(_dict(obj.get("metadata")).get("name"), NAME_CHARS)


def labels_of(obj: Obj) -> dict[str, str]:
    labels = _dict(_dict(obj.get("metadata")).get("labels"))
    return {str(k): str(v) for k, v in labels.items()}


def nodes_in_scope(nodes: Iterable[Obj], selector: Selector) -> list[str]:
    """The names of the Nodes the selector matches, sorted."""
    return sorted({name_of(n) for n in nodes if selector.matches(labels_of(n))} - {""})


def statuses_by_node(statuses: Iterable[Obj]) -> dict[str, Obj]:
    """NodeImageStatus objects by the node they describe (the object's name)."""
    return {name_of(s): s for s in statuses if name_of(s)}


def heartbeat_age_s(status: Obj, now: dt.datetime) -> float | None:
    """Seconds since ``lastHeartbeatTime``; None when absent or not a time."""
    text = _dict(status.get("status")).get("lastHeartbeatTime")
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return (now - when).total_seconds()


# ---------------------------------------------------------------- judging one node


def _entry(status: Obj, bundle_id: str) -> Mapping[str, Any] | None:
    """The node's entry for ``bundle_id`` that reached the furthest step."""
    entries = [
        _dict(e)
        for e in _list(_dict(status.get("status")).get("bundles"))
        if _dict(e).get("bundleId") == bundle_id
    ]
    return max(entries, key=lambda e: _RANK.get(str(e.get("state")), -1), default=None)


def _bytes_left(entry: Mapping[str, Any]) -> int | None:
    progress = _dict(entry.get("progress"))
    done, total = _int(progress.get("doneBytes")), _int(progress.get("totalBytes"))
    if done is None or total is None:
        return None
    return max(total - done, 0)


def _bundle_report(node: str, entry: Mapping[str, Any] | None) -> NodeReport:
    if entry is None:
        return NodeReport(node, "absent", message="does not hold the bundle (not seen)")
    state = _text(entry.get("state"), 32)
    total = _int(_dict(entry.get("images")).get("total"))
    reason = _text(entry.get("reason"), REASON_CHARS)
    message = _text(entry.get("message"), MESSAGE_CHARS)
    if state == "pinned":
        return NodeReport(node, "pinned", state, images_total=total)
    if state in FAILING_STATES:
        return NodeReport(node, "failing", state, reason or state, message, images_total=total)
    left = _bytes_left(entry) if state in ("fetching", "storing", "importing") else None
    is_moving = state in ("fetching", "storing", "importing") or state not in HOLDING_STATES
    verdict: Verdict = "progressing" if is_moving else "holding"
    return NodeReport(node, verdict, state, bytes_left=left, images_total=total)


def _set_report(node: str, status: Obj, set_name: str, bundle: NodeReport) -> NodeReport:
    """With ``--set``: the set's state decides; the bundle's failure still counts."""
    sets = _list(_dict(status.get("status")).get("pinnedImageSets"))
    found = next((_dict(s) for s in sets if _dict(s).get("name") == set_name), None)
    if bundle.verdict == "failing":
        return bundle
    if found is None:
        return NodeReport(node, "absent", bundle.state, message="the set is not on the node")
    state = _text(found.get("state"), 32)
    current, desired = found.get("currentGeneration"), found.get("desiredGeneration")
    if state == "Pinned" and current is not None and current == desired:
        return NodeReport(node, "pinned", state, images_total=bundle.images_total)
    if state in FAILING_SET_STATES:
        failed = [_dict(f) for f in _list(found.get("failedImages"))]
        first = failed[0] if failed else {}
        message = first.get("message") or found.get("lastFailedGenerationError") or state
        reason = _text(first.get("reason") or found.get("reason") or state, REASON_CHARS)
        return NodeReport(node, "failing", state, reason, _text(message, MESSAGE_CHARS))
    images = _dict(found.get("images"))
    pinned, total = _int(images.get("pinned")), _int(images.get("total"))
    count = f"{pinned} of {total} images pinned" if pinned is not None and total else ""
    left = _int(_dict(found.get("bytes")).get("toPull")) or None  # 0 there: unknown
    gen = f"generation {current}/{desired}" if current != desired else ""
    note = ", ".join(t for t in (gen, count) if t)
    return NodeReport(node, "progressing", f"set {state}", message=note, bytes_left=left)


def judge_node(
    node: str,
    status: Obj | None,
    bundle_id: str,
    set_name: str | None,
    *,
    now: dt.datetime,
    stale_after_s: float,
) -> NodeReport:
    """The standing of one Node in scope (``status``: its NodeImageStatus, or None)."""
    if status is None:
        return NodeReport(node, "no-status")
    if not isinstance(status.get("status"), Mapping):
        return NodeReport(node, "unreadable", reason="StatusMissing", message="empty status")
    report = _bundle_report(node, _entry(status, bundle_id))
    if set_name is not None:
        report = _set_report(node, status, set_name, report)
    age = heartbeat_age_s(status, now)
    if report.verdict == "progressing" and (age is None or age > stale_after_s):
        seen = "never" if age is None else f"{age:.0f} s ago"
        return NodeReport(
            node,
            "stale",
            report.state,
            "HeartbeatStale",
            f"{report.why()}; last heartbeat {seen} (bound {stale_after_s:.0f} s): is the agent "
            "running?",
        )
    return report


# ---------------------------------------------------------------- the views


def _conflicts(statuses: Mapping[str, Obj], nodes: Sequence[str], bundle_id: str) -> list[Conflict]:
    totals: dict[str, int] = {}
    for node in nodes:
        entry = _entry(statuses[node], bundle_id) if node in statuses else None
        total = _int(_dict(entry.get("images")).get("total")) if entry else None
        if entry is not None and total and entry.get("state") in _COUNTED_STATES:
            totals[node] = total
    if len(set(totals.values())) < 2:
        return []
    common = Counter(totals.values()).most_common(1)[0][0]
    return [Conflict(n, t, common) for n, t in sorted(totals.items()) if t != common]


def bundle_view(
    nodes: Sequence[str],
    statuses: Mapping[str, Obj],
    bundle_id: str,
    set_name: str | None = None,
    *,
    now: dt.datetime,
    stale_after_s: float,
    holdings: Mapping[str, Holdings] | None = None,
) -> BundleView:
    """The bundle (and set) on every Node named in ``nodes`` (the scope, already selected);
    ``holdings``: the valid NodeImageHoldings by node."""
    reports = tuple(
        judge_node(n, statuses.get(n), bundle_id, set_name, now=now, stale_after_s=stale_after_s)
        for n in nodes
    )
    held = holdings or {}
    found = holders(held, nodes, bundle_id)
    unpublished = [n for n in nodes if n not in held]
    return BundleView(
        clip(bundle_id, ID_CHARS),
        clip(set_name, ID_CHARS) if set_name is not None else None,
        reports,
        tuple(_conflicts(statuses, unpublished, bundle_id)),
        found,
        digest_conflicts(found),
    )


def bundle_ids(statuses: Iterable[Obj]) -> list[str]:
    """Every bundle id any status mentions (raw, unclipped: the key to look entries up)."""
    found = {
        e.get("bundleId")
        for s in statuses
        for e in map(_dict, _list(_dict(s.get("status")).get("bundles")))
    }
    return sorted(i for i in found if isinstance(i, str) and i)


def site_views(
    nodes: Sequence[str],
    statuses: Mapping[str, Obj],
    *,
    now: dt.datetime,
    stale_after_s: float,
    holdings: Mapping[str, Holdings] | None = None,
) -> list[BundleView]:
    """One view per bundle id seen anywhere in the scope (a status or the holdings)."""
    held = holdings or {}
    seen = set(bundle_ids(statuses[n] for n in nodes if n in statuses))
    seen |= bundle_ids_held(held[n] for n in nodes if n in held)
    return [
        bundle_view(nodes, statuses, i, now=now, stale_after_s=stale_after_s, holdings=held)
        for i in sorted(seen)
    ]


def release_notes(nodes: Sequence[str], statuses: Mapping[str, Obj]) -> list[dict[str, str]]:
    """The releases a node in scope reports as not upgrading the cluster's version
    (``status.releases[].reason``, docs/upgrade.md): node, version, reason, message."""
    notes = []
    for node in nodes:
        releases = _list(_dict(_dict(statuses.get(node)).get("status")).get("releases"))
        for item in map(_dict, releases[:20]):
            reason = _text(item.get("reason"), 64)
            if reason:
                notes.append(
                    {
                        "node": clip(node, ID_CHARS),
                        "version": _text(item.get("version"), 64),
                        "reason": reason,
                        "message": _text(item.get("message"), 512),
                    }
                )
    return notes
