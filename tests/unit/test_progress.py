"""Progress in bytes: throttled to one update per interval, rate over a window, ETA."""

from __future__ import annotations

import pytest

from nodeagent.progress import ByteProgress, ProgressMeter, eta_s

MB = 1_000_000


def test_updates_come_at_most_once_per_interval() -> None:
    meter = ProgressMeter(100 * MB, 0.0, interval_s=2.0)
    shown = [meter.advance(MB, t / 10) for t in range(1, 51)]  # 50 chunks over 5 s
    times = [p.elapsed_s for p in shown if p is not None]
    assert times == [2.0, 4.0]


def test_rate_and_eta_follow_the_last_window() -> None:
    meter = ProgressMeter(200 * MB, 0.0, interval_s=1.0, window_s=2.0)
    for t in range(1, 11):  # 10 MB/s for 10 s
        meter.advance(10 * MB, float(t))
    for t in range(11, 15):  # then 1 MB/s
        shown = meter.advance(MB, float(t))
    assert shown is not None
    assert shown.rate_bytes_per_s == pytest.approx(MB, rel=0.01)
    assert shown.eta_s == pytest.approx(96, rel=0.02)


def test_no_rate_means_no_eta_not_zero() -> None:
    assert eta_s(0, 100, None) is None
    assert eta_s(0, 100, 0.0) is None
    first = ProgressMeter(100, 5.0).snapshot(5.0)
    assert (first.rate_bytes_per_s, first.eta_s) == (None, None)


def test_finish_reports_the_whole_average_and_a_resumed_start() -> None:
    meter = ProgressMeter(10 * MB, 0.0, done_bytes=4 * MB)
    meter.advance(6 * MB, 3.0)
    final = meter.finish(3.0)
    assert final.is_final and final.fraction == 1.0
    assert final.rate_bytes_per_s == pytest.approx(2 * MB)


def test_describe_reads_as_a_sentence() -> None:
    text = ByteProgress(312 * 2**20, 2**30, 38.2e6, 18.4, 10.0).describe()
    assert text == "312 MiB of 1 GiB (30 %), 38.2 MB/s, about 18 s left"
