"""The peer client's time bounds (``adapters.http.client``: ``Pace``, ``RequestBounds``)."""

from __future__ import annotations

from nodeagent.adapters.http.client import Pace, RequestBounds


def test_a_window_that_brings_its_quota_starts_a_new_one() -> None:
    pace = Pace(min_rate_bytes_s=1000, window_s=5.0)
    assert pace.quota == 5000 and pace.time_left_s() == 5.0
    pace.read(4000, 4.0)
    assert pace.time_left_s() == 1.0  # 1000 more bytes needed within 1 s
    pace.read(1000, 0.5)
    assert pace.time_left_s() == 5.0 and pace.total_bytes == 5000


def test_a_peer_sending_a_byte_every_few_seconds_runs_out_of_its_window() -> None:
    pace = Pace(min_rate_bytes_s=64 << 10, window_s=5.0)
    waits = 0
    while pace.time_left_s() > 0:
        pace.read(1, 2.0)
        waits += 1
    assert waits == 3  # cut within the third read: about 5 s, not 59 s a byte for ever
    assert "under the minimum of 64 KiB/s" in pace.describe()


def test_the_total_deadline_grows_with_the_size_at_the_minimum_rate() -> None:
    bounds = RequestBounds(head_s=10.0, min_rate_bytes_s=1 << 20, window_s=5.0)
    assert bounds.deadline_s(0) == 20.0
    assert bounds.deadline_s(100 << 20) == 120.0
