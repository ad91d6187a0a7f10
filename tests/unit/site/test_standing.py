"""What the fetcher measured of its peers (``nodeagent.site.standing``): bounded, clock-free."""

from __future__ import annotations

import pytest

from nodeagent.site.standing import DEMOTE_S, MAX_PEERS, Lru, PeerStandings


def test_an_lru_keeps_at_most_its_bound_and_forgets_the_least_recently_used() -> None:
    memo: Lru[int, str] = Lru(3)
    for i in range(3):
        memo[i] = str(i)
    assert memo.get(0) == "0"  # 0 used: 1 is now the oldest
    memo[3] = "3"
    assert list(memo) == [2, 0, 3]
    for i in range(10_000):
        memo[i] = "x"
    assert len(memo) == 3
    assert memo.pop(9_999) == "x" and memo.pop(9_999) is None
    with pytest.raises(ValueError, match="at least one"):
        Lru(0)


def test_standings_stay_bounded_however_many_addresses_are_seen() -> None:
    standings = PeerStandings()
    for i in range(5 * MAX_PEERS):
        standings.failed(f"10.0.{i // 250}.{i % 250}:9447", 0.0)
    assert len(standings) == MAX_PEERS


def test_a_failure_demotes_for_a_minute_doubling_up_to_an_hour() -> None:
    standings = PeerStandings()
    first, most = DEMOTE_S
    assert standings.failed("a", 0.0) == first
    assert standings.is_demoted("a", first - 1) and not standings.is_demoted("a", first)
    assert standings.failed("a", 0.0) == 2 * first
    for _ in range(40):
        last = standings.failed("a", 0.0)
    assert last == most
    assert not standings.is_demoted("never-seen", 0.0)


def test_a_peer_that_says_it_is_idle_but_sends_slowly_is_not_preferred() -> None:
    standings = PeerStandings()
    standings.served("fast", 10 << 20, 1.0)  # 10 MiB/s
    standings.served("slow", 64 << 10, 1.0)  # 64 KiB/s
    known = standings.measured(["fast", "slow", "new"])
    # fast with 2 uploads under way still beats slow saying 0
    assert standings.seconds_per_blob("fast", 2, known, 0.0) < standings.seconds_per_blob(
        "slow", 0, known, 0.0
    )
    # one never measured is taken at the median: between the two
    new = standings.seconds_per_blob("new", 0, known, 0.0)
    assert standings.seconds_per_blob("fast", 0, known, 0.0) < new
    # a demoted peer comes after every other, whatever it says
    standings.failed("fast", 0.0)
    assert standings.seconds_per_blob("fast", 0, known, 0.0) > standings.seconds_per_blob(
        "slow", 2, known, 0.0
    )


def test_a_blob_served_forgives_one_failure() -> None:
    standings = PeerStandings()
    standings.failed("a", 0.0)
    standings.failed("a", 0.0)
    standings.served("a", 1, 1.0)
    assert standings.of("a").failures == 1
