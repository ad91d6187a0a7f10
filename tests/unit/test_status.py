"""Unit tests of the node status: JSON shapes, error truncation, conditions, the status line."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.status import (
    MAX_ERROR_CHARS,
    MAX_FAILED_IMAGES,
    Condition,
    DiskStatus,
    ImageFailure,
    NodeStatus,
    SetState,
    SetStatus,
    conditions_for,
    progress_line,
    status_line,
    truncate_error,
)


def set_status(
    name: str = "s",
    state: SetState = "Pinned",
    *,
    total: int = 2,
    present: int | None = None,
    pinned: int | None = None,
    failures: int = 0,
    reason: str | None = None,
    **extra: Any,
) -> SetStatus:
    fields: dict[str, Any] = {
        "current_generation": None,
        "last_failed_generation": None,
        "last_failed_error": None,
    } | extra
    return SetStatus(
        name=name,
        source="/etc/nodeagent/sets/s.yaml",
        is_persistent=True,
        state=state,
        desired_generation=3,
        images_total=total,
        images_present=total if present is None else present,
        images_pinned=total if pinned is None else pinned,
        failures=tuple(
            ImageFailure(f"r.io/i{i}", "ImageNotFound", "gone") for i in range(failures)
        ),
        reason=reason,
        **fields,
    )


# ---------------------------------------------------------------- SetStatus.to_json
def test_set_status_json_minimal_shape_omits_unset_optional_fields() -> None:
    assert set_status().to_json() == {
        "name": "s",
        "source": "/etc/nodeagent/sets/s.yaml",
        "persistent": True,
        "state": "Pinned",
        "desiredGeneration": 3,
        "images": {"total": 2, "present": 2, "pinned": 2, "failed": 0},
        "bytes": {"present": 0, "toPull": 0},
    }


def test_set_status_json_full_shape_uses_camel_case() -> None:
    doc = set_status(
        state="Degraded",
        failures=1,
        reason="ImageNotFound",
        current_generation=2,
        last_failed_generation=3,
        last_failed_error="1 image(s) failed",
    ).to_json()
    assert doc["currentGeneration"] == 2
    assert doc["lastFailedGeneration"] == 3
    assert doc["lastFailedGenerationError"] == "1 image(s) failed"
    assert doc["reason"] == "ImageNotFound"
    assert doc["failedImages"] == [
        {"image": "r.io/i0", "reason": "ImageNotFound", "message": "gone"}
    ]
    assert all("_" not in key for key in doc)


def test_current_generation_zero_is_reported_not_omitted() -> None:
    assert set_status(current_generation=0).to_json()["currentGeneration"] == 0


@pytest.mark.parametrize("count", [1, MAX_FAILED_IMAGES, MAX_FAILED_IMAGES + 1, 500])
def test_failed_images_are_bounded_while_the_count_stays_exact(count: int) -> None:
    doc = set_status(state="Degraded", total=600, failures=count).to_json()
    assert len(doc["failedImages"]) == min(count, MAX_FAILED_IMAGES)
    assert doc["images"]["failed"] == count
    assert doc["failedImages"][0]["image"] == "r.io/i0"


# ---------------------------------------------------------------- NodeStatus.to_json
def test_node_status_json_minimal_shape() -> None:
    status = NodeStatus(sets=(), conditions=(), updated_at="2025-01-01T00:00:00+00:00")
    assert status.to_json() == {
        "updatedAt": "2025-01-01T00:00:00+00:00",
        "conditions": [],
        "pinnedImageSets": [],
        "images": {"total": 0, "present": 0, "pinned": 0, "failed": 0, "pulling": 0},
    }


def test_node_status_json_full_shape() -> None:
    sets = (
        set_status("a", total=3),
        set_status("b", "Progressing", total=5, present=2, pinned=0, failures=1),
    )
    status = NodeStatus(
        sets=sets,
        conditions=(Condition("Ready", False, "Pulling", "m"),),
        runtime="cri-o 1.34.0",
        disk=DiskStatus("/var/lib/containers", 10, 4, 2),
        problems=({"file": "/x.yaml", "set": "", "reason": "SpecInvalid", "message": "bad"},),
        last_error="PinsOverridden: 99-late sorts after",
        pulling=3,
        updated_at="t",
        extra={"mode": "standalone"},
    )
    doc = status.to_json()
    assert doc["images"] == {"total": 8, "present": 5, "pinned": 3, "failed": 1, "pulling": 3}
    assert [s["name"] for s in doc["pinnedImageSets"]] == ["a", "b"]
    assert doc["conditions"] == [
        {"type": "Ready", "status": "False", "reason": "Pulling", "message": "m"}
    ]
    assert doc["runtime"] == "cri-o 1.34.0"
    assert doc["disk"] == {
        "mountpoint": "/var/lib/containers",
        "availableBytes": 10,
        "neededBytes": 4,
        "reserveBytes": 2,
    }
    assert doc["specProblems"] == [
        {"file": "/x.yaml", "set": "", "reason": "SpecInvalid", "message": "bad"}
    ]
    assert doc["lastError"] == "PinsOverridden: 99-late sorts after"
    assert doc["mode"] == "standalone"


# ---------------------------------------------------------------- truncate_error
@pytest.mark.parametrize("size", [0, 1, MAX_ERROR_CHARS - 1, MAX_ERROR_CHARS])
def test_errors_within_the_limit_are_kept_whole(size: int) -> None:
    text = "e" * size
    assert truncate_error(text) == text


@pytest.mark.parametrize("size", [MAX_ERROR_CHARS + 1, 2 * MAX_ERROR_CHARS, 10**6])
def test_longer_errors_are_cut_to_the_limit_and_say_so(size: int) -> None:
    text = "é" + "e" * (size - 1)
    cut = truncate_error(text)
    assert MAX_ERROR_CHARS - 2 <= len(cut) <= MAX_ERROR_CHARS
    assert cut.startswith("éeee")
    assert cut.endswith("(truncated)")


def test_error_limit_is_the_machine_config_node_limit() -> None:
    assert MAX_ERROR_CHARS == 32768


# ---------------------------------------------------------------- conditions_for
def conditions(
    sets: list[SetStatus], problems: int = 0, sync_error: tuple[str, str] | None = None
) -> dict[str, tuple[bool, str, str]]:
    return {
        c.type: (c.is_true, c.reason, c.message) for c in conditions_for(sets, problems, sync_error)
    }


def test_all_pinned_is_ready() -> None:
    got = conditions([set_status("a", total=3), set_status("b", total=2)])
    assert got == {
        "Ready": (True, "AllPinned", "5 images pinned in 2 set(s)"),
        "Progressing": (False, "AsExpected", "nothing to do"),
        "Degraded": (False, "AsExpected", "no failures"),
    }


def test_nothing_to_do_is_ready() -> None:
    assert conditions([])["Ready"] == (True, "AllPinned", "0 images pinned in 0 set(s)")


def test_progressing_sets_are_not_ready_and_not_degraded() -> None:
    got = conditions(
        [
            set_status("a"),
            set_status("b", "Progressing", pinned=0),
            set_status("c", "Progressing", pinned=1),
        ]
    )
    assert got["Ready"] == (False, "Pulling", "3 images pinned in 1 set(s)")
    assert got["Progressing"] == (True, "Pulling", "working on b, c")
    assert got["Degraded"] == (False, "AsExpected", "no failures")


@pytest.mark.parametrize(
    ("sets", "reason", "message"),
    [
        (
            [set_status("a", "Degraded", reason="ImageNotFound"), set_status("b")],
            "ImageNotFound",
            "1 PinnedImageSet(s) failed: a",
        ),
        (
            [
                set_status("a", "Refused", reason="InsufficientDiskSpace"),
                set_status("b", "Degraded", reason="PullStalled"),
            ],
            "InsufficientDiskSpace",
            "2 PinnedImageSet(s) failed: a, b",
        ),
        ([set_status("a", "Refused")], "Refused", "1 PinnedImageSet(s) failed: a"),
        ([set_status("a", "Degraded")], "Degraded", "1 PinnedImageSet(s) failed: a"),
    ],
)
def test_failed_sets_degrade_the_node(sets: list[SetStatus], reason: str, message: str) -> None:
    got = conditions(sets)
    assert got["Degraded"] == (True, reason, message)
    assert got["Ready"][:2] == (False, reason)


def test_degraded_and_progressing_at_once_reports_the_failure_as_why_not_ready() -> None:
    got = conditions(
        [set_status("a", "Progressing"), set_status("b", "Degraded", reason="RegistryAuthFailed")]
    )
    assert got["Progressing"][0] is True
    assert got["Ready"][:2] == (False, "RegistryAuthFailed")


def test_spec_problems_degrade_the_node() -> None:
    got = conditions([set_status("a")], problems=2)
    assert got["Degraded"] == (True, "SpecInvalid", "2 invalid spec(s)")
    assert got["Ready"][:2] == (False, "SpecInvalid")


def test_failed_sets_take_precedence_over_spec_problems() -> None:
    got = conditions([set_status("a", "Degraded", reason="ImageNotFound")], problems=1)
    assert got["Degraded"][1] == "ImageNotFound"


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("RuntimeUnreachable", "crio.sock: connection refused"),
        ("HostFileError", "cannot write /var/lib/nodeagent/ledger.json: No space left on device"),
    ],
)
def test_a_sync_that_could_not_run_names_its_own_cause_over_everything(
    reason: str, message: str
) -> None:
    got = conditions(
        [set_status("a", "Degraded", reason="ImageNotFound")],
        problems=1,
        sync_error=(reason, message),
    )
    assert got["Degraded"] == (True, reason, message)
    assert got["Ready"][:2] == (False, reason)


def test_conditions_serialize_status_as_strings() -> None:
    assert Condition("Ready", True, "AllPinned", "m").to_json() == {
        "type": "Ready",
        "status": "True",
        "reason": "AllPinned",
        "message": "m",
    }


# ---------------------------------------------------------------- status_line
@pytest.mark.parametrize(
    ("sets", "pulling", "sync_error", "line"),
    [
        ([], 0, None, "pinned 0/0 images"),
        ([set_status("a", total=3)], 0, None, "pinned 3/3 images"),
        (
            [set_status("a", total=3), set_status("b", "Progressing", total=2, pinned=0)],
            2,
            None,
            "pinned 3/5 images, pulling 2",
        ),
        (
            [set_status("a", "Degraded", total=5, pinned=3, failures=2, reason="ImageNotFound")],
            1,
            None,
            "pinned 3/5 images, pulling 1, 2 failed (ImageNotFound)",
        ),
        (
            [set_status("a", total=2)],
            0,
            ("RuntimeUnreachable", "connection refused"),
            "pinned 2/2 images (RuntimeUnreachable)",
        ),
    ],
)
def test_status_line(
    sets: list[SetStatus], pulling: int, sync_error: tuple[str, str] | None, line: str
) -> None:
    status = NodeStatus(
        sets=tuple(sets), conditions=conditions_for(sets, 0, sync_error), pulling=pulling
    )
    assert status_line(status) == line


@pytest.mark.parametrize(
    ("counts", "line"),
    [
        ((0, 190, 4, 0), "pinned 0/190 images, pulling 4"),
        ((183, 190, 4, 1), "pinned 183/190 images, pulling 4, 1 failed"),
        ((2, 2, 0, 0), "pinned 2/2 images"),
    ],
)
def test_progress_line(counts: tuple[int, int, int, int], line: str) -> None:
    assert progress_line(*counts) == line


def test_progress_line_counts_live_pulls_and_failures_on_the_interim_status() -> None:
    from nodeagent.ports import PullEvent, PullStep
    from nodeagent.reporting import Reporter

    class Line:
        def __init__(self) -> None:
            self.sent: list[str] = []

        def status(self, text: str) -> None:
            self.sent.append(text)

    class Store:
        def load(self, name: str) -> dict[str, Any] | None:
            return None

        def save(self, name: str, obj: dict[str, Any]) -> bool:
            return True

        def set_aside(self, name: str) -> str | None:
            return None

    line = Line()
    reporter = Reporter(line=line, store=Store())
    reporter.pull_event(PullEvent(PullStep.STARTED, "a", 1))
    assert line.sent == []  # no status yet: nothing to count against
    reporter.sync_started()
    reporter.sync_progress(
        NodeStatus(
            sets=(set_status("s", "Progressing", total=3, present=0, pinned=0),), conditions=()
        )
    )
    assert line.sent == ["pinned 0/3 images"]
    reporter.pull_event(PullEvent(PullStep.STARTED, "a", 1))
    reporter.pull_event(PullEvent(PullStep.STARTED, "b", 1))
    reporter.pull_event(PullEvent(PullStep.PULLED, "a", 1, seconds=1.0))
    reporter.pull_event(PullEvent(PullStep.FAILED, "b", 1, reason="ImageNotFound", error="gone"))
    assert line.sent[1:] == [
        "pinned 0/3 images, pulling 1",
        "pinned 0/3 images, pulling 2",
        "pinned 0/3 images, pulling 1",
        "pinned 0/3 images, 1 failed",
    ]
    assert reporter.tally.snapshot().pulled == frozenset({"a"})
