"""A release bundle's next steps: in the status once its sets are pinned, and in the journal.

A node says that it is ready and how many nodes are ready where it can know it; it never
tells its reader to start the upgrade (issue 28 item 5, decision 0073)."""

from __future__ import annotations

import ast
from pathlib import Path

import structlog

import nodeagent
from nodeagent.releases import SITE_UNKNOWN, SiteReadiness
from nodeagent.reporting import BundleBoard
from nodeagent.status import BundleReport, ReleaseReport

STEPS = ("release 4.16.3 is pinned on this node (PinnedImageSet release-4.16.3)", "see the site")
DIGEST = "sha256:" + "a" * 64
RELEASE = ReleaseReport("4.16.3", DIGEST, "release-4.16.3")
PACKAGE = Path(nodeagent.__file__).resolve().parent
SITE_VIEW = {"cli/site.py", "cluster/one_touch.py", "cluster/starting.py", "cluster/site.py"}
"""Modules that may tell an admin to start an upgrade: the site view and the one-touch starter."""


def _report(release: ReleaseReport | None = RELEASE) -> BundleReport:
    return BundleReport(
        "/m", "imported", "b1", sets=("release-4.16.3", "apps"), next_steps=STEPS, release=release
    )


def test_the_next_steps_appear_when_the_release_set_is_pinned() -> None:
    board = BundleBoard()
    board.update(_report())
    assert "nextSteps" not in board.to_json()[0]
    with structlog.testing.capture_logs() as logs:
        board.mark_pinned({"release-4.16.3"})  # not yet: apps is not pinned
        assert "nextSteps" not in board.to_json()[0]
        board.mark_pinned({"release-4.16.3", "apps"})
    site = f"this node is ready; {SITE_UNKNOWN}"
    assert board.to_json()[0]["nextSteps"] == [STEPS[0], site, STEPS[1]]
    assert [e["event"] for e in logs] == ["bundle_pinned", "release_pinned"]
    assert (logs[1]["next"], logs[1]["site"]) == (STEPS[0], site)


def test_the_site_count_is_read_at_each_status_and_by_digest() -> None:
    counts = {DIGEST: SiteReadiness(2, 3, "NodeImageStatuses")}
    board = BundleBoard(site_readiness=counts.get)
    board.update(_report())
    with structlog.testing.capture_logs() as logs:
        board.mark_pinned({"release-4.16.3", "apps"})
    said = "this node is ready; 2 of 3 nodes ready (NodeImageStatuses)"
    assert logs[1]["site"] == said
    assert board.current()[0].next_steps[1] == said
    counts[DIGEST] = SiteReadiness(3, 3, "NodeImageStatuses")
    assert board.current()[0].next_steps[1].endswith("; 3 of 3 nodes ready (NodeImageStatuses)")


def test_a_bundle_without_a_release_says_no_next_step() -> None:
    board = BundleBoard()
    board.update(BundleReport("/m", "imported", "b1", sets=("apps",)))
    with structlog.testing.capture_logs() as logs:
        board.mark_pinned({"apps"})
    assert "nextSteps" not in board.to_json()[0]
    assert [e["event"] for e in logs] == ["bundle_pinned"]


def _strings(path: Path) -> list[str]:
    """The module's string values, docstrings left out (they speak to a developer)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_no_node_side_text_tells_its_reader_to_start_an_upgrade() -> None:
    """Only the site view may say `oc adm upgrade`: a node's journal and status never do."""
    saying = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any("oc adm upgrade" in text for text in _strings(path))
    )
    assert saying, "the scan found no site view at all: it reads nothing"
    assert set(saying) <= SITE_VIEW, saying
