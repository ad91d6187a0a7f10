"""The node mirror's state in the daemon's status (decision 0063): "serving" only while a
fresh report says so; before the mirror process starts (socket activation) its socket unit
says "ready" or "failed"; what nobody said is "unknown", never serving."""

from __future__ import annotations

import pytest

from nodeagent.mirror.board import (
    SOCKET_RECHECK_S,
    STALE_S,
    MirrorBoard,
    MirrorState,
    socket_state,
)
from nodeagent.mirror.state import MirrorReport

LISTEN = "127.0.0.1:22626"


def report(*, serving: bool = True, requests: int = 3) -> MirrorReport:
    return MirrorReport(serving, 10, 2, requests, 4096, 1, 0)


@pytest.mark.parametrize(
    ("active", "sub", "state"),
    [
        ("active", "listening", "ready"),
        ("active", "running", "ready"),
        ("failed", "failed", "failed"),
        ("inactive", "dead", "failed"),
        ("deactivating", "stop-post", "failed"),
        ("activating", "start-pre", "unknown"),
        ("reloading", "listening", "unknown"),
        ("something-new", "x", "unknown"),
    ],
)
def test_the_socket_units_state(active: str, sub: str, state: MirrorState) -> None:
    assert socket_state(active, sub) == state


def test_nothing_said_yet_is_no_status_and_a_check_is_wanted() -> None:
    board = MirrorBoard(LISTEN)
    assert board.status(0.0) is None
    assert board.wants_socket_check(0.0)
    assert board.state(0.0) == "unknown"


def test_ready_before_the_first_request_counts_zero_and_is_not_serving() -> None:
    board = MirrorBoard(LISTEN)
    board.socket_checked("ready", 1.0)
    status = board.status(2.0)
    assert status is not None
    assert (status.state, status.serving, status.requests, status.reported_at) == (
        "ready", False, 0, ""
    )  # fmt: skip
    assert status.to_json()["state"] == "ready"
    assert not board.wants_socket_check(2.0)
    assert board.wants_socket_check(1.0 + SOCKET_RECHECK_S)


def test_a_failed_socket_is_failed() -> None:
    board = MirrorBoard(LISTEN)
    board.socket_checked("failed", 1.0)
    status = board.status(1.0)
    assert status is not None and (status.state, status.serving) == ("failed", False)


def test_a_fresh_report_serves_and_needs_no_check() -> None:
    board = MirrorBoard(LISTEN)
    board.socket_checked("ready", 0.0)
    board.reported(report(), "at", 10.0)
    status = board.status(10.0 + STALE_S - 1)
    assert status is not None and (status.state, status.serving, status.requests) == (
        "serving", True, 3
    )  # fmt: skip
    assert not board.wants_socket_check(10.0 + STALE_S - 1)


def test_a_stale_report_is_not_serving_and_the_socket_is_asked_again() -> None:
    """The process killed without its last report: not serving any more; the socket says
    whether the next request starts it again."""
    board = MirrorBoard(LISTEN)
    board.socket_checked("ready", 0.0)
    board.reported(report(), "at", 10.0)
    later = 10.0 + STALE_S
    assert board.state(later) == "ready"  # the last socket answer, until asked again
    assert board.wants_socket_check(later)
    board.socket_checked("failed", later)
    status = board.status(later)
    assert status is not None and (status.state, status.serving) == ("failed", False)
    assert status.requests == 3  # the counts of the last report stay


def test_a_report_that_says_it_stopped_is_not_serving() -> None:
    board = MirrorBoard(LISTEN)
    board.reported(report(serving=False), "at", 5.0)
    assert board.state(5.0) == "unknown"
    assert board.wants_socket_check(5.0)


def test_without_a_socket_answer_a_stale_report_is_unknown_never_serving() -> None:
    board = MirrorBoard(LISTEN)
    board.reported(report(), "at", 0.0)
    assert board.state(STALE_S) == "unknown"
    status = board.status(STALE_S)
    assert status is not None and not status.serving
