"""Long copies, fetches and imports say where they are in the journal: a line every 30 s or
5 %, whichever is later (``progress.ProgressLog``, ``reporting.Reporter.bundle_report``)."""

from __future__ import annotations

from dataclasses import replace

from structlog.testing import capture_logs

from nodeagent.progress import ByteProgress, ProgressLog
from nodeagent.reporting import Reporter
from nodeagent.status import BundleReport
from tests.fakes.ports import MemoryStore, RecordingLine

GB = 1_000_000_000


def test_a_line_needs_both_30_s_and_5_percent_since_the_last() -> None:
    pacer = ProgressLog()
    assert not pacer.is_due("sdb1", "storing", 0.0, 0.0)  # the start: its own line exists
    assert not pacer.is_due("sdb1", "storing", 0.20, 10.0)  # 20 % but only 10 s
    assert pacer.is_due("sdb1", "storing", 0.21, 30.0)  # 30 s and 21 %
    assert not pacer.is_due("sdb1", "storing", 0.22, 90.0)  # a slow copy: 90 s but 1 %
    assert pacer.is_due("sdb1", "storing", 0.26, 91.0)  # 5 % reached, 61 s since the last
    assert not pacer.is_due("sdb1", "storing", 0.90, 100.0)  # fast: 9 s since the last


def test_another_step_or_a_restart_counts_from_its_own_start() -> None:
    pacer = ProgressLog()
    pacer.is_due("sdb1", "storing", 0.0, 0.0)
    assert not pacer.is_due("sdb1", "importing", 0.5, 100.0)  # a new step starts its count
    assert pacer.is_due("sdb1", "importing", 0.6, 130.0)
    assert not pacer.is_due("sdb1", "importing", 0.1, 500.0)  # started over: less done
    pacer.forget("sdb1")
    assert not pacer.is_due("sdb1", "importing", 0.9, 900.0)


def storing(done: int, total: int, elapsed_s: float) -> BundleReport:
    progress = ByteProgress(done, total, 100e6, None, elapsed_s)
    return BundleReport(
        "/dev/sdb1",
        "storing",
        bundle_id="line-3",
        progress=progress.to_json(),
        progress_text=progress.describe(),
    )


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_a_16_gb_copy_says_where_it_is_every_30_s_not_at_every_update() -> None:
    clock = Clock()
    reporter = Reporter(line=RecordingLine(), store=MemoryStore(), clock=clock)
    total = 16 * GB
    with capture_logs() as logs:
        for second in range(0, 161, 2):  # the copier's updates, every 2 s at 100 MB/s
            clock.now_s = float(second)
            reporter.bundle_report(storing(second * 100_000_000, total, float(second)))
        reporter.bundle_report(replace(storing(total, total, 160.0), state="stored", progress=None))
    lines = [e for e in logs if e["event"] == "bundle_progressed"]
    assert [e["progress"].split(" (")[1].split(")")[0] for e in lines] == [
        "19 %", "38 %", "56 %", "75 %", "94 %",
    ]  # fmt: skip
    assert lines[0] == {
        "event": "bundle_progressed",
        "log_level": "info",
        "bundle": "line-3",
        "step": "storing",
        "progress": "2.8 GiB of 14.9 GiB (19 %), 100.0 MB/s",
    }


def test_a_slow_copy_says_where_it_is_every_5_percent() -> None:
    clock = Clock()
    reporter = Reporter(line=RecordingLine(), store=MemoryStore(), clock=clock)
    total = 100 * GB
    with capture_logs() as logs:
        for second in range(0, 3101, 2):  # 10 MB/s: 1 % every 100 s
            clock.now_s = float(second)
            reporter.bundle_report(storing(second * 10_000_000, total, float(second)))
    times = [e["progress"] for e in logs if e["event"] == "bundle_progressed"]
    assert len(times) == 6  # 5, 10, ... 30 %: 500 s apart, not every 30 s
