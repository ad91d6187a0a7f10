"""The node's status as Kubernetes objects: apply body, conditions, events, pacing."""

from __future__ import annotations

import json
from typing import Any

from nodeagent.cluster.objects import (
    MAX_FAILED_IMAGES,
    MAX_FAILED_TOTAL,
    MAX_SETS,
    NodeIdentity,
    WritePacer,
    event_object,
    merge_conditions,
    owner_object,
    status_object,
    transitions,
)
from nodeagent.cluster.placement import Placement
from nodeagent.status import (
    Condition,
    ImageFailure,
    NodeStatus,
    PullProgress,
    SetStatus,
    conditions_for,
)

NODE = NodeIdentity("edge-1", "uid-1")
NOW = "2026-11-22T10:00:00Z"
LATER = "2026-11-22T10:05:00Z"
IDLE = PullProgress()


def a_set(name: str = "apps", state: Any = "Pinned", **changes: Any) -> SetStatus:
    fields: dict[str, Any] = {
        "name": name,
        "source": f"/var/lib/nodeagent/cluster/pinnedimagesets.d/{name}.yaml",
        "is_persistent": True,
        "state": state,
        "desired_generation": 2,
        "current_generation": 2 if state == "Pinned" else 1,
        "last_failed_generation": None,
        "last_failed_error": None,
        "images_total": 3,
        "images_present": 3,
        "images_pinned": 3 if state == "Pinned" else 0,
        "bytes_present": 3000,
    }
    return SetStatus(**(fields | changes))


def node_status(*sets: SetStatus) -> NodeStatus:
    return NodeStatus(sets=sets, conditions=conditions_for(sets, 0, None), runtime="cri-o 1.34.0")


def body(status: NodeStatus, progress: PullProgress = IDLE, **kw: Any) -> Any:
    kw.setdefault("placement", None)
    kw.setdefault("previous_conditions", [])
    return status_object(NODE, status, progress, now=NOW, agent_version="0.1.0", **kw)


def test_complete_node_reads_ready_with_generations() -> None:
    doc = body(node_status(a_set()))
    assert doc["apiVersion"] == "nodeagent.io/v1alpha1"
    assert doc["kind"] == "NodeImageStatus"
    assert doc["metadata"] == {"name": "edge-1"}
    status = doc["status"]
    ready = {c["type"]: c for c in status["conditions"]}
    assert ready["Ready"]["status"] == "True"
    assert ready["Ready"]["reason"] == "AllPinned"
    assert ready["Degraded"]["status"] == "False"
    assert all(c["lastTransitionTime"] == NOW for c in status["conditions"])
    (item,) = status["pinnedImageSets"]
    assert item["desiredGeneration"] == item["currentGeneration"] == 2
    assert item["images"] == {"total": 3, "present": 3, "pinned": 3, "failed": 0}
    assert status["images"]["pinned"] == 3
    assert status["bytes"] == {"present": 3000, "toPull": 0}
    assert status["runtime"] == "cri-o 1.34.0"


def test_live_pulls_show_as_progressing_with_per_image_progress() -> None:
    pending = ("r/a@x", "r/b@x", "r/c@x")
    s = a_set(state="Progressing", images_present=0, pending=pending, bytes_to_pull=900)
    progress = PullProgress(pulling=("r/b@x", "r/c@x"), pulled=frozenset({"r/a@x"}))
    status = body(node_status(s), progress)["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Progressing"]["status"] == "True"
    assert conditions["Progressing"]["reason"] == "Pulling"
    assert "pulling 2 image(s), 1 pulled" in conditions["Progressing"]["message"]
    assert conditions["Ready"]["status"] == "False"
    assert status["images"]["present"] == 1
    assert status["images"]["pulling"] == 2
    assert status["pulling"] == ["r/b@x", "r/c@x"]
    assert status["pinnedImageSets"][0]["images"]["present"] == 1
    assert status["pinnedImageSets"][0]["bytes"]["toPull"] == 900


def test_failures_are_bounded_and_reasons_match_codes() -> None:
    failures = tuple(
        ImageFailure(f"r/{i}@x", "ImageNotFound", "manifest unknown " * 100) for i in range(30)
    )
    s = a_set(
        state="Degraded",
        failures=failures,
        reason="ImageNotFound",
        last_failed_generation=2,
        last_failed_error="x" * 40000,
    )
    status = body(node_status(s))["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ImageNotFound")
    item = status["pinnedImageSets"][0]
    assert len(item["failedImages"]) == MAX_FAILED_IMAGES
    assert item["images"]["failed"] == 30
    assert all(len(f["message"]) <= 512 for f in item["failedImages"])
    assert len(item["lastFailedGenerationError"]) <= 4096


def test_a_node_with_many_large_sets_stays_well_under_the_etcd_object_limit() -> None:
    failures = tuple(
        ImageFailure("r/" + "n" * 400 + f"{i}@x", "PullStalled", "m" * 2000) for i in range(40)
    )
    sets = [
        a_set(f"set-{i:03d}-" + "n" * 200, state="Degraded", failures=failures,
              last_failed_generation=2, last_failed_error="e" * 40000, reason="PullStalled")
        for i in range(150)
    ]  # fmt: skip
    doc = body(node_status(*sets))
    assert len(doc["status"]["pinnedImageSets"]) == MAX_SETS
    assert doc["status"]["setCount"] == 150
    listed = sum(len(s.get("failedImages", ())) for s in doc["status"]["pinnedImageSets"])
    assert listed == MAX_FAILED_TOTAL
    assert doc["status"]["images"]["failed"] == 150 * 40
    assert len(json.dumps(doc)) < 1024 * 1024


def test_placement_is_reported() -> None:
    placement = Placement("pools", ("edge", "worker"), ("a",), ("gone",))
    status = body(node_status(a_set("a")), placement=placement)["status"]
    assert status["placement"] == {
        "mode": "pools",
        "pools": ["edge", "worker"],
        "missingSets": ["gone"],
    }


def test_transition_time_moves_only_when_status_changes() -> None:
    first = merge_conditions([], (Condition("Ready", False, "Pulling", "m"),), NOW)
    same = merge_conditions(first, (Condition("Ready", False, "Pulling", "other text"),), LATER)
    assert same[0]["lastTransitionTime"] == NOW
    flipped = merge_conditions(same, (Condition("Ready", True, "AllPinned", "m"),), LATER)
    assert flipped[0]["lastTransitionTime"] == LATER


def test_owner_reference_only_once_the_node_uid_is_known() -> None:
    owned = owner_object(NODE)
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "edge-1", "uid": "uid-1"}
    ]
    assert owned["spec"] == {"nodeName": "edge-1"}
    assert "ownerReferences" not in owner_object(NodeIdentity("edge-1", ""))["metadata"]


def test_events_for_pinned_and_failed_transitions_only() -> None:
    progressing = node_status(a_set(state="Progressing"), a_set("other"))
    pinned = node_status(a_set(), a_set("other"))
    events = transitions(progressing, pinned)
    assert [(e.type, e.reason, e.set_name) for e in events] == [
        ("Normal", "PinnedImageSetPinned", "apps")
    ]
    assert transitions(pinned, pinned) == []
    assert [e.set_name for e in transitions(None, pinned)] == ["apps", "other"]
    failed = node_status(
        a_set(state="Refused", reason="InsufficientDiskSpace", last_failed_error="need 3 GiB"),
        a_set("other"),
    )
    (event,) = transitions(pinned, failed)
    assert (event.type, event.reason) == ("Warning", "PinnedImageSetFailed")
    assert "InsufficientDiskSpace" in event.message
    assert "need 3 GiB" in event.message
    regenerated = node_status(a_set(desired_generation=3, current_generation=3), a_set("other"))
    assert [e.reason for e in transitions(pinned, regenerated)] == ["PinnedImageSetPinned"]


def test_event_object_is_about_the_node() -> None:
    (event,) = transitions(None, node_status(a_set()))
    doc = event_object(NODE, event, namespace="default", now=NOW)
    assert doc["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "edge-1",
        "uid": "uid-1",
    }
    assert doc["metadata"]["namespace"] == "default"
    assert doc["metadata"]["name"].startswith("edge-1.")
    assert doc["reportingComponent"] == "nodeagent"
    again = event_object(NODE, event, namespace="default", now=LATER)
    assert again["metadata"]["name"] != doc["metadata"]["name"]


def test_pacer_coalesces_writes_and_beats_while_busy() -> None:
    pacer = WritePacer(min_interval_s=5, heartbeat_s=60)
    doc = body(node_status(a_set()))
    assert pacer.delay(100.0, is_changed=True, is_busy=False) == 0.0
    pacer.written(100.0, doc)
    assert not pacer.is_changed(body(node_status(a_set())))  # only timestamps differ
    assert pacer.is_changed(body(node_status(a_set(state="Progressing"))))
    assert pacer.delay(101.0, is_changed=True, is_busy=True) == 4.0
    assert pacer.delay(106.0, is_changed=True, is_busy=True) == 0.0
    assert pacer.delay(110.0, is_changed=False, is_busy=True) == 50.0
    assert pacer.delay(170.0, is_changed=False, is_busy=True) == 0.0
    assert pacer.delay(170.0, is_changed=False, is_busy=False) is None


def test_pacer_writes_milestones_soon_and_progress_alone_seldom() -> None:
    pacer = WritePacer(min_interval_s=5, heartbeat_s=60, progress_interval_s=30)
    pending = ("r/a@x", "r/b@x", "r/c@x")
    s = a_set(state="Progressing", images_present=0, pending=pending)
    pacer.written(100.0, body(node_status(s), PullProgress(pulling=("r/a@x",), is_syncing=True)))
    one_pulled = PullProgress(pulling=("r/b@x",), pulled=frozenset({"r/a@x"}), is_syncing=True)
    progressed = body(node_status(s), one_pulled)
    assert pacer.is_changed(progressed)
    assert not pacer.is_milestone(progressed)  # counts, bytes, in-flight list, messages
    assert pacer.delay(101.0, is_changed=True, is_busy=True, is_milestone=False) == 29.0
    failed = a_set(
        state="Degraded",
        images_present=0,
        pending=pending,
        failures=(ImageFailure("r/c@x", "ImageNotFound", "manifest unknown"),),
        reason="ImageNotFound",
    )
    assert pacer.is_milestone(body(node_status(failed), one_pulled))
    assert pacer.delay(101.0, is_changed=True, is_busy=True, is_milestone=True) == 4.0
    done = body(node_status(a_set()), PullProgress())
    assert pacer.is_milestone(done)  # the set pinned: Ready flips
    # progress never goes out faster than a milestone could
    fast = WritePacer(min_interval_s=5, heartbeat_s=60, progress_interval_s=1)
    fast.written(100.0, done)
    assert fast.delay(101.0, is_changed=True, is_busy=True, is_milestone=False) == 4.0


def test_bundle_progress_and_image_loss_are_reported_and_progress_is_no_milestone() -> None:
    from dataclasses import replace

    from nodeagent.cluster.objects import milestones
    from nodeagent.progress import ByteProgress
    from nodeagent.status import BundleReport

    def storing(done: int) -> BundleReport:
        progress = ByteProgress(done, 1000, 40e6, 1.5, 2.0)
        return BundleReport(
            "/dev/sdb1",
            "storing",
            bundle_id="line-3\x1b[2J" + "x" * 600,
            images_total=4,
            progress=progress.to_json(),
            progress_text=progress.describe(),
        )

    loss = {"reason": "RuntimeImagesLost", "imagesLost": 2, "message": "m" * 5000}
    status = replace(node_status(a_set("a")), bundles=(storing(100),), image_loss=loss)
    doc = body(status)["status"]
    (item,) = doc["bundles"]
    assert item["state"] == "storing"
    assert item["progress"]["doneBytes"] == 100 and item["progress"]["totalBytes"] == 1000
    assert "\x1b" not in item["bundleId"] and len(item["bundleId"]) < 600
    assert doc["imageLoss"]["reason"] == "RuntimeImagesLost"
    assert len(doc["imageLoss"]["message"]) < 1100
    later = body(replace(status, bundles=(storing(900),)))["status"]
    assert milestones(later) == milestones(doc)  # bytes alone wait for the progress pacing
    stored = replace(storing(1000), state="stored", is_medium_removable=True, progress=None)
    done = body(replace(status, bundles=(stored,)))["status"]
    assert milestones(done) != milestones(doc)
    assert done["bundles"][0]["mediumRemovable"] is True
