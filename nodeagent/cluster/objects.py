"""The node's status as Kubernetes objects (pure): the status object and Events.

* ``status_object`` renders a ``NodeStatus`` (plus live pull progress) as the
  server-side-apply body of the node's ``NodeImageStatus`` (deploy/crds). Everything is
  bounded so that 100 sets of 500 images stay far below etcd's 1.5 MiB object limit.
* ``merge_conditions`` keeps ``lastTransitionTime`` when a condition's status did not change.
* ``transitions`` turns two successive statuses into Events for the Node (set pinned, set
  failed), so ``kubectl describe node`` tells the story.
* The optional mirror into OpenShift's MachineConfigNode is ``machine_config_node``.
* ``WritePacer`` decides when to write: a milestone (a set's state, a condition, a failure,
  a generation) at most ``min_interval_s`` after the last write; mere pull progress (counts,
  bytes, the images in flight) at most once per ``progress_interval_s``; and a heartbeat
  every ``heartbeat_s`` while pulls run, so a reader can tell a slow pull from a dead agent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nodeagent.cluster.kinds import NODE_IMAGE_STATUS
from nodeagent.cluster.placement import Placement
from nodeagent.releases import release_rows, releases_json
from nodeagent.status import BundleReport, Condition, NodeStatus, PullProgress, SetStatus
from nodeagent.strict import clip

FIELD_MANAGER = "nodeagent"
MAX_SETS = 100
"""Sets listed in the object (MachineConfigNode's bound); the counts cover all."""
MAX_FAILED_IMAGES = 10
"""Failing images listed per set; the counts are always exact."""
MAX_FAILED_TOTAL = 100
"""Failing images listed in the whole object."""
MAX_MESSAGE_CHARS = 512
MAX_SET_ERROR_CHARS = 1024
"""Per-set error text in the object; the journal and the local status file keep it all."""
MAX_PULLING = 20
MAX_PROBLEMS = 20


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    name: str
    uid: str


def _clip(text: str, limit: int) -> str:
    """At most ``limit`` characters (the schema's maxLength), control characters escaped."""
    return text if len(text) <= limit and text.isprintable() else clip(text, limit - 32)


def live_conditions(status: NodeStatus, progress: PullProgress) -> tuple[Condition, ...]:
    """The sync's conditions, with Progressing/Ready reflecting pulls running right now."""
    if not progress.pulling:
        return status.conditions
    busy = Condition(
        "Progressing",
        True,
        "Pulling",
        f"pulling {len(progress.pulling)} image(s), {len(progress.pulled)} pulled so far",
    )
    out = []
    for condition in status.conditions:
        if condition.type == "Progressing":
            out.append(busy)
        elif condition.type == "Ready" and condition.is_true:
            out.append(Condition("Ready", False, "Pulling", busy.message))
        else:
            out.append(condition)
    return tuple(out)


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    current: Sequence[Condition],
    now: str,
    *,
    max_message_chars: int = MAX_MESSAGE_CHARS,
) -> list[dict[str, str]]:
    """metav1.Condition lists: ``lastTransitionTime`` moves only when ``status`` changes."""
    before = {c.get("type"): c for c in previous}
    merged = []
    for condition in current:
        doc = condition.to_json()
        doc["message"] = _clip(doc["message"], max_message_chars)
        old = before.get(condition.type)
        same = old is not None and old.get("status") == doc["status"]
        doc["lastTransitionTime"] = str(old.get("lastTransitionTime")) if same and old else now
        merged.append(doc)
    return merged


def _set_json(s: SetStatus, progress: PullProgress, failures_left: int) -> dict[str, Any]:
    pulled_now = sum(1 for ref in s.pending if ref in progress.pulled)
    doc: dict[str, Any] = {
        "name": s.name,
        "state": s.state,
        "desiredGeneration": s.desired_generation,
        "images": {
            "total": s.images_total,
            "present": s.images_present + pulled_now,
            "pinned": s.images_pinned,
            "failed": len(s.failures),
        },
        "bytes": {"present": s.bytes_present, "toPull": s.bytes_to_pull},
    }
    optional: dict[str, Any] = {
        "currentGeneration": s.current_generation,
        "lastFailedGeneration": s.last_failed_generation,
        "lastFailedGenerationError": _failed_error(s),
        "reason": s.reason,
    }
    doc |= {key: value for key, value in optional.items() if value is not None}
    listed = s.failures[: min(MAX_FAILED_IMAGES, failures_left)]
    if listed:
        doc["failedImages"] = [
            {"image": f.ref, "reason": f.reason, "message": _clip(f.message, MAX_MESSAGE_CHARS)}
            for f in listed
        ]
    return doc


def _failed_error(s: SetStatus) -> str | None:
    """The error of the last failed generation: the CRD (MachineConfigNode's rule) wants one
    with every ``lastFailedGeneration``, so an empty text becomes the set's reason."""
    if s.last_failed_generation is None:
        return _clip(s.last_failed_error, MAX_SET_ERROR_CHARS) if s.last_failed_error else None
    return _clip(s.last_failed_error or s.reason or "failed", MAX_SET_ERROR_CHARS)


def _sets_json(sets: Sequence[SetStatus], progress: PullProgress) -> list[dict[str, Any]]:
    out = []
    left = MAX_FAILED_TOTAL
    for s in sets[:MAX_SETS]:
        out.append(_set_json(s, progress, left))
        left -= len(out[-1].get("failedImages", ()))
    return out


MAX_BUNDLES = 10
MAX_MISSING = 16
"""Digests the node mirror was asked for and lacks, kept in ``nodeMirror.recentMissing``."""


def _bundle_json(report: BundleReport) -> dict[str, Any]:
    """A bundle's entry: its step, images and byte progress; texts clipped to the schema."""
    doc = report.to_json()
    item: dict[str, Any] = {
        "source": _clip(report.source, 512),
        "bundleId": _clip(report.bundle_id, 512),
        "state": report.state,
        "images": doc["images"],
    }
    if report.is_medium_removable:
        item["mediumRemovable"] = True
    if "progress" in doc:
        progress = {k: v for k, v in doc["progress"].items() if v is not None}
        item["progress"] = progress | {"text": _clip(report.progress_text, 256)}
    if report.reason:
        item["reason"] = report.reason
        item["message"] = _clip(report.message or "", 1024)
    return item


def _placement_json(placement: Placement) -> dict[str, Any]:
    doc: dict[str, Any] = {"mode": placement.mode, "pools": list(placement.pools)}
    if placement.missing:
        doc["missingSets"] = list(placement.missing)
    if placement.reason:
        doc["reason"] = placement.reason
    if placement.message:
        doc["message"] = _clip(placement.message, 1024)
    return doc


def status_object(
    node: NodeIdentity,
    status: NodeStatus,
    progress: PullProgress,
    *,
    placement: Placement | None,
    previous_conditions: Sequence[Mapping[str, Any]],
    now: str,
    agent_version: str,
) -> dict[str, Any]:
    """The apply body of the node's NodeImageStatus ``/status`` subresource."""
    totals = status.image_totals()
    pulled_now = sum(1 for s in status.sets for ref in s.pending if ref in progress.pulled)
    body: dict[str, Any] = {
        "nodeName": node.name,
        "agentVersion": agent_version,
        "lastHeartbeatTime": now,
        "conditions": merge_conditions(previous_conditions, live_conditions(status, progress), now),
        "images": {
            "total": totals["total"],
            "present": totals["present"] + pulled_now,
            "pinned": totals["pinned"],
            "failed": totals["failed"],
            "pulling": len(progress.pulling),
        },
        "bytes": {
            "present": sum(s.bytes_present for s in status.sets),
            "toPull": sum(s.bytes_to_pull for s in status.sets),
        },
        "setCount": len(status.sets),
        "pinnedImageSets": _sets_json(status.sets, progress),
    }
    if progress.pulling:
        body["pulling"] = sorted(progress.pulling)[:MAX_PULLING]
    if status.runtime:
        body["runtime"] = status.runtime
    if status.disk:
        body["disk"] = status.disk.to_json()
    if status.problems:
        body["specProblems"] = [
            {k: _clip(v, MAX_MESSAGE_CHARS) for k, v in p.items()}
            for p in status.problems[:MAX_PROBLEMS]
        ]
    if status.last_error:
        body["lastError"] = _clip(status.last_error, MAX_SET_ERROR_CHARS)
    body |= _observed(status)
    if placement is not None:
        body["placement"] = _placement_json(placement)
    return {
        "apiVersion": NODE_IMAGE_STATUS.api_version,
        "kind": NODE_IMAGE_STATUS.kind,
        "metadata": {"name": node.name},
        "status": body,
    }


def _observed(status: NodeStatus) -> dict[str, Any]:
    """Bundles, image losses and the OS image, bounded as the CRD wants."""
    body: dict[str, Any] = {}
    if status.bundles:
        body["bundles"] = [_bundle_json(r) for r in status.bundles[-MAX_BUNDLES:]]
    if rows := release_rows(status):
        body["releases"] = releases_json(rows)
    if status.image_loss is not None:
        loss = dict(status.image_loss)
        body["imageLoss"] = loss | {"message": _clip(str(loss.get("message", "")), 1024)}
    if status.os_image is not None:
        body["osImage"] = status.os_image.to_json()
    if status.mirror is not None:
        mirror = status.mirror.to_json()
        body["nodeMirror"] = mirror | {"recentMissing": mirror["recentMissing"][:MAX_MISSING]}
    return body


def owner_object(node: NodeIdentity) -> dict[str, Any]:
    """The object itself (applied once): named after the node and owned by it."""
    metadata: dict[str, Any] = {"name": node.name}
    if node.uid:  # unknown until the Node was read; applied again once it is
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}
        ]
    return {
        "apiVersion": NODE_IMAGE_STATUS.api_version,
        "kind": NODE_IMAGE_STATUS.kind,
        "metadata": metadata,
        "spec": {"nodeName": node.name},
    }


def comparable(body: Mapping[str, Any]) -> dict[str, Any]:
    """The status without its timestamps: equal when nothing a reader cares about changed."""
    status = dict(body.get("status") or {})
    status.pop("lastHeartbeatTime", None)
    status["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions", [])
    ]
    return status


_PROGRESS_ONLY = ("pulling", "bytes")
"""Status fields that move with every pull: not milestones."""


def milestones(status: Mapping[str, Any]) -> dict[str, Any]:
    """A ``comparable`` status without pull progress: what changes when a set changes state,
    a condition flips or changes reason, an image fails or a generation moves. Condition
    messages (which carry the counts) and image counts other than failures are left out."""
    out = {k: v for k, v in status.items() if k not in _PROGRESS_ONLY and k != "images"}
    out["failed"] = (status.get("images") or {}).get("failed")
    out["conditions"] = [
        {k: v for k, v in c.items() if k != "message"} for c in status.get("conditions", [])
    ]
    out["bundles"] = [
        {k: v for k, v in item.items() if k != "progress"} for item in status.get("bundles", [])
    ]
    out["pinnedImageSets"] = [
        {k: v for k, v in item.items() if k not in _PROGRESS_ONLY and k != "images"}
        | {"failed": (item.get("images") or {}).get("failed")}
        for item in status.get("pinnedImageSets", [])
    ]
    return out


# ---------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class NodeEvent:
    type: str  # Normal or Warning
    reason: str
    message: str
    set_name: str


def transitions(before: NodeStatus | None, after: NodeStatus) -> list[NodeEvent]:
    """Events for sets that became Pinned, or failed (again, at a new generation)."""
    old = {s.name: s for s in before.sets} if before else {}
    events = []
    for s in after.sets:
        prior = old.get(s.name)
        moved = prior is None or prior.state != s.state
        regenerated = prior is not None and prior.desired_generation != s.desired_generation
        if s.state == "Pinned" and (moved or regenerated):
            events.append(
                NodeEvent(
                    "Normal",
                    "PinnedImageSetPinned",
                    f"PinnedImageSet {s.name} generation {s.desired_generation}: "
                    f"{s.images_pinned} image(s) pinned",
                    s.name,
                )
            )
        elif s.state in ("Degraded", "Refused") and (moved or regenerated):
            events.append(
                NodeEvent(
                    "Warning",
                    "PinnedImageSetFailed",
                    _clip(
                        f"PinnedImageSet {s.name} generation {s.desired_generation} failed "
                        f"({s.reason}): {s.last_failed_error or s.state}",
                        1024,
                    ),
                    s.name,
                )
            )
    return events


def event_object(
    node: NodeIdentity, event: NodeEvent, *, namespace: str, now: str
) -> dict[str, Any]:
    """A core/v1 Event about the Node, with a name that is stable for the same occurrence."""
    digest = hashlib.sha256(f"{event.reason}\0{event.message}\0{now}".encode()).hexdigest()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{node.name}.{digest[:16]}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid},
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "source": {"component": "nodeagent", "host": node.name},
        "reportingComponent": "nodeagent",
        "reportingInstance": node.name,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


# ---------------------------------------------------------------- pacing


@dataclass
class WritePacer:
    """When the next status write is due, given the last write and what changed since."""

    min_interval_s: float
    heartbeat_s: float
    progress_interval_s: float = 0.0
    """Progress alone (counts, bytes, images in flight) waits this long after the last
    write; 0: as long as ``min_interval_s``."""
    last_write: float | None = None
    last_written: dict[str, Any] = field(default_factory=dict)

    def delay(
        self, now: float, *, is_changed: bool, is_busy: bool, is_milestone: bool = True
    ) -> float | None:
        """Seconds until the next write (0: now), or None: nothing to write until a change.

        ``is_changed``: the body differs from the last written one; ``is_milestone``: in
        more than pull progress (see ``milestones``)."""
        if self.last_write is None:
            return 0.0
        since = now - self.last_write
        if is_changed:
            wait = self.min_interval_s if is_milestone else self.progress_interval_s
            return max(max(wait, self.min_interval_s) - since, 0.0)
        if is_busy:
            return max(self.heartbeat_s - since, 0.0)
        return None

    def written(self, now: float, body: Mapping[str, Any]) -> None:
        self.last_write = now
        self.last_written = comparable(body)

    def is_changed(self, body: Mapping[str, Any]) -> bool:
        return comparable(body) != self.last_written

    def is_milestone(self, body: Mapping[str, Any]) -> bool:
        return milestones(comparable(body)) != milestones(self.last_written)
