"""A release bundle's next steps: in the status once its sets are pinned, and in the journal."""

from __future__ import annotations

import structlog

from nodeagent.reporting import BundleBoard
from nodeagent.status import BundleReport

STEPS = ("release 4.16.3 is pinned ...; to upgrade, run: oc adm upgrade --to-image=x", "then")


def test_the_next_steps_appear_when_the_release_set_is_pinned() -> None:
    board = BundleBoard()
    board.update(
        BundleReport("/m", "imported", "b1", sets=("release-4.16.3", "apps"), next_steps=STEPS)
    )
    assert "nextSteps" not in board.to_json()[0]
    with structlog.testing.capture_logs() as logs:
        board.mark_pinned({"release-4.16.3"})  # not yet: apps is not pinned
        assert "nextSteps" not in board.to_json()[0]
        board.mark_pinned({"release-4.16.3", "apps"})
    assert board.to_json()[0]["nextSteps"] == list(STEPS)
    assert [e["event"] for e in logs] == ["bundle_pinned", "release_pinned"]
    assert logs[1]["next"] == STEPS[0]


def test_a_bundle_without_a_release_says_no_next_step() -> None:
    board = BundleBoard()
    board.update(BundleReport("/m", "imported", "b1", sets=("apps",)))
    with structlog.testing.capture_logs() as logs:
        board.mark_pinned({"apps"})
    assert "nextSteps" not in board.to_json()[0]
    assert [e["event"] for e in logs] == ["bundle_pinned"]
