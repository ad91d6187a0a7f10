"""Upload slots and the bandwidth token bucket, on a clock the test turns."""

from __future__ import annotations

import pytest

from nodeagent.site.limits import PER_PEER, TokenBucket, UploadSlots


def test_slots_refuse_a_greedy_peer_then_everyone_when_full() -> None:
    slots = UploadSlots(max_uploads=4)
    assert [slots.take("a") for _ in range(PER_PEER)] == [None] * PER_PEER
    assert slots.take("a") == "too-many"
    assert slots.take("b") is None
    assert slots.take("d") is None
    assert slots.active == 4
    assert slots.take("c") == "busy"
    assert slots.take("a") == "too-many"  # the peer's own bound is told first
    slots.give_back("a")
    assert slots.take("c") is None
    for peer in ("a", "b", "c", "d"):
        slots.give_back(peer)
    assert slots.active == 0
    with pytest.raises(ValueError, match="no upload slot"):
        slots.give_back("a")


@pytest.mark.parametrize(("max_uploads", "per_peer"), [(1, 1), (2, 1), (3, 1), (4, 2), (256, 2)])
def test_one_peer_takes_at_most_half_the_slots(max_uploads: int, per_peer: int) -> None:
    slots = UploadSlots(max_uploads)
    assert slots.per_peer == per_peer
    assert [slots.take("a") for _ in range(per_peer)] == [None] * per_peer
    assert slots.take("a") == "too-many"


def test_bucket_paces_to_its_rate_after_the_burst() -> None:
    bucket = TokenBucket(rate_bytes_s=1000, burst_bytes=500, now_s=0.0)
    assert bucket.reserve(500, 0.0) == 0.0  # the burst
    assert bucket.reserve(250, 0.0) == pytest.approx(0.25)
    assert bucket.reserve(250, 0.0) == pytest.approx(0.5)  # queued behind the first
    # 1.5 s later: the 500 owed are paid and the bucket is full again, never fuller
    assert bucket.reserve(1000, 1.5) == pytest.approx(0.5)
    sent, now = 0, 2.0  # when that reservation's wait ends: the bucket is empty
    for _ in range(100):  # steady state: 100 steps of 100 bytes take 10 s
        now += bucket.reserve(100, now)
        sent += 100
    assert sent / (now - 2.0) == pytest.approx(1000, rel=0.02)


def test_bucket_needs_a_rate() -> None:
    with pytest.raises(ValueError, match="positive"):
        TokenBucket(rate_bytes_s=0, burst_bytes=1, now_s=0.0)
