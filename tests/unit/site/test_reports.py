"""nodeagent.site.reports: the peer process's reports parsed strictly, and the daemon's
work on them bounded (dedupe, queue, pacing) on a virtual clock."""

from __future__ import annotations

import pytest

from nodeagent.site.reports import (
    CHECK_BURST,
    CHECK_EVERY_S,
    MAX_QUEUED,
    RECHECK_AFTER_S,
    CorruptReport,
    ReportGate,
    ServedReport,
    parse_report,
    render_corrupt,
    render_served,
)

DIGEST = "sha256:" + "ab" * 32


def digest(i: int) -> str:
    return f"sha256:{i:064x}"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (render_corrupt(DIGEST), CorruptReport(DIGEST)),
        (render_served(1), ServedReport(1)),
        (render_served(1 << 44), ServedReport(1 << 44)),
        (render_served((1 << 44) + 1), None),  # beyond any 15 s of any link
        (b"served 0", None),
        (b"served -1", None),
        (b"served 01", None),
        (b"corrupt sha256:" + b"AB" * 32, None),  # lowercase only
        (b"corrupt sha256:" + b"ab" * 31, None),
        (b"corrupt " + DIGEST.encode() + b"\n", None),  # whole datagram, nothing more
        (b"corrupt ../../etc/shadow", None),
        (b"x" * 4000, None),
        (b"", None),
        (b"\xff\xfe", None),
    ],
)
def test_a_datagram_is_exactly_one_report_or_none(data: bytes, expected: object) -> None:
    assert parse_report(data) == expected


def test_a_digest_is_checked_once_then_not_again_before_recheck_after() -> None:
    gate = ReportGate(0.0)
    assert gate.offer(DIGEST, 0.0) is None
    assert gate.offer(DIGEST, 0.0) == "queued_already"
    assert gate.next_check(0.0) == (DIGEST, 0.0)
    assert gate.offer(DIGEST, 1.0) == "recently_checked"
    assert gate.offer(DIGEST, RECHECK_AFTER_S - 1) == "recently_checked"
    assert gate.offer(DIGEST, RECHECK_AFTER_S + 1) is None


def test_the_queue_is_bounded_and_checks_are_paced() -> None:
    gate = ReportGate(0.0)
    refusals = [gate.offer(digest(i), 0.0) for i in range(MAX_QUEUED + 10)]
    assert refusals.count(None) == MAX_QUEUED
    assert refusals.count("queue_full") == 10
    checked = []
    while True:
        found, wait_s = gate.next_check(0.0)
        if found is None:
            break
        checked.append(found)
    assert len(checked) == CHECK_BURST  # a burst, then one per CHECK_EVERY_S
    assert wait_s == pytest.approx(CHECK_EVERY_S)
    assert gate.next_check(CHECK_EVERY_S - 0.1)[0] is None
    assert gate.next_check(CHECK_EVERY_S)[0] == digest(CHECK_BURST)
    assert gate.refused == {"queue_full": 10}


def test_an_idle_gate_says_nothing_waits() -> None:
    assert ReportGate(0.0).next_check(5.0) == (None, float("inf"))
