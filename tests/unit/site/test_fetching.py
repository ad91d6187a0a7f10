"""Which blob from which peer (``nodeagent.site.fetching``): table-driven, clock-free."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.site.fetching import NO_PEER_LEFT, FetchSchedule, fetching_digests, held_digests
from nodeagent.site.holdings import have_of
from nodeagent.site.limits import PER_PEER
from nodeagent.site.standing import PeerStandings

A, B, C = "10.0.0.1:9447", "10.0.0.2:9447", "10.0.0.3:9447"
D1, D2, D3, D4 = (f"sha256:{c * 64}" for c in "1234")


def schedule(
    needed: dict[str, int],
    peers: dict[str, tuple[frozenset[str], int]],
    *,
    concurrency: int = 4,
    seed: int = 0,
) -> FetchSchedule:
    found = FetchSchedule.start(
        needed,
        list(peers),
        concurrency=concurrency,
        rng=random.Random(seed),  # noqa: S311  (a seeded test)
    )
    for address, (have, active) in peers.items():
        found.learn(address, have=have, reported_active=active)
    return found


EVERY = frozenset({D1, D2, D3, D4})


@pytest.mark.parametrize(
    ("peers", "expected"),
    [
        # the least busy peer that has the blob
        ({A: (EVERY, 3), B: (EVERY, 0), C: (EVERY, 1)}, B),
        # only A has it, however busy
        ({A: (frozenset({D1}), 3), B: (frozenset(), 0)}, A),
        # B is least busy but lacks it
        ({A: (frozenset({D1}), 2), B: (frozenset({D2}), 0), C: (frozenset({D1}), 1)}, C),
    ],
)
def test_a_blob_goes_to_the_least_busy_peer_that_has_it(
    peers: dict[str, tuple[frozenset[str], int]], expected: str
) -> None:
    plan = schedule({D1: 10}, peers)
    assert plan.assign(0.0) == [(D1, expected)]
    assert plan.in_flight == {D1: expected}


def test_our_own_requests_in_flight_count_as_load() -> None:
    plan = schedule({D1: 1, D2: 1, D3: 1, D4: 1}, {A: (EVERY, 0), B: (EVERY, 0)})
    started = plan.assign(0.0)
    assert len(started) == 4
    # two each: a peer with one of ours in flight is busier than one with none
    assert Counter(peer for _, peer in started) == {A: PER_PEER, B: PER_PEER}


def test_ties_are_broken_at_random() -> None:
    chosen = {
        schedule({D1: 1}, {A: (EVERY, 1), B: (EVERY, 1), C: (EVERY, 1)}, seed=seed).assign(0.0)[0][
            1
        ]
        for seed in range(40)
    }
    assert chosen == {A, B, C}


def test_blobs_equally_rare_are_taken_in_an_order_of_each_nodes_own() -> None:
    """Nodes fetching side by side ask for different blobs first, so they soon hold different
    blobs to give each other; one node keeps its order for the whole fetch."""
    needed = {D1: 1, D2: 1, D3: 1, D4: 1}
    firsts = {
        schedule(needed, {A: (EVERY, 0)}, concurrency=1, seed=seed).assign(0.0)[0][0]
        for seed in range(40)
    }
    assert firsts == set(needed)
    plan = schedule(needed, {A: (EVERY, 0), B: (EVERY, 0)}, concurrency=1, seed=7)
    order = []
    while plan.needed:
        ((digest, _),) = plan.assign(0.0)
        order.append(digest)
        plan.stored(digest)
    again = schedule(needed, {A: (EVERY, 0), B: (EVERY, 0)}, concurrency=1, seed=7)
    assert [again.assign(0.0)[0][0]] == order[:1]
    assert sorted(order) == sorted(needed)


def test_a_peer_that_is_this_node_is_forgotten() -> None:
    plan = schedule({D1: 1}, {A: (EVERY, 0), B: (EVERY, 0)})
    plan.forget(B)
    assert plan.assign(0.0) == [(D1, A)]
    plan.forget(A)  # a request in flight: kept until it ends
    assert A in plan.peers


def test_at_most_concurrency_in_flight_and_per_peer_at_most_two() -> None:
    plan = schedule({D1: 1, D2: 1, D3: 1, D4: 1}, {A: (EVERY, 0)}, concurrency=3)
    assert len(plan.assign(0.0)) == PER_PEER  # the peer server answers a third with 429
    plan = schedule({D1: 1, D2: 1, D3: 1, D4: 1}, {A: (EVERY, 0), B: (EVERY, 0)}, concurrency=3)
    assert len(plan.assign(0.0)) == 3
    assert plan.assign(0.0) == []  # nothing more until one ends


def test_a_peer_is_asked_no_more_at_once_than_it_takes_from_one_client() -> None:
    plan = schedule({D1: 1, D2: 1, D3: 1}, {A: (EVERY, 0)}, concurrency=8)
    plan.learn(A, have=EVERY, reported_active=0, uploads_max=3)  # half of 3: one
    assert len(plan.assign(0.0)) == 1  # not a second one the server would answer 429
    plan.learn(A, have=EVERY, reported_active=0, uploads_max=8)
    assert len(plan.assign(0.0)) == 1  # two in all now


def test_rarest_blob_first() -> None:
    peers = {A: (frozenset({D1, D2}), 0), B: (frozenset({D1}), 0)}
    plan = schedule({D1: 1, D2: 1}, peers, concurrency=1)
    assert plan.assign(0.0) == [(D2, A)]


def test_a_blob_another_node_is_fetching_is_taken_later_and_from_that_node() -> None:
    # A has everything (the stick's node); B fetches D1 from it now and already holds D3
    plan = schedule({D1: 1, D2: 1, D3: 1}, {A: (frozenset({D1, D2, D3}), 0)}, concurrency=1)
    plan.learn(B, have=frozenset(), reported_active=0)  # unknown peer: ignored
    plan.add_peer(B)
    plan.learn(B, have=frozenset({D3}), reported_active=0, fetching=frozenset({D1}))
    # D2: only A has it, nobody fetches it (1); D3: two holders (2); D1: A, and B fetching (3)
    assert plan.assign(0.0) == [(D2, A)]
    plan.stored(D2)
    assert plan.assign(0.0) == [(D3, B)]  # from B, which holds it: A sends nothing twice
    plan.stored(D3)
    assert plan.assign(0.0) == [(D1, A)]  # in the end it is taken, from whoever has it


def test_a_dropped_peer_fetching_counts_for_nothing() -> None:
    peers = {A: (frozenset({D1, D2}), 0), C: (frozenset({D2}), 0)}
    plan = schedule({D1: 1, D2: 1}, peers, concurrency=1)
    plan.add_peer(B)
    plan.learn(B, have=frozenset(), reported_active=0, fetching=frozenset({D1}))
    assert plan.assign(0.0)[0][0] == D2  # D1: one holder and B fetching it (3) > D2's two
    plan.returned(D2)
    plan.drop(B, "PeerAnswerInvalid")  # a dropped peer's word is not believed
    assert plan.assign(0.0)[0][0] == D1


def test_a_dropped_peer_is_never_asked_again_and_its_blob_goes_elsewhere() -> None:
    plan = schedule({D1: 5}, {A: (EVERY, 0), B: (EVERY, 9)})
    assert plan.assign(0.0) == [(D1, A)]
    assert plan.drop(A, "StoreSourceMismatch")  # it sent wrong bytes
    assert not plan.drop(A, "PeerUnreachable")  # once
    plan.returned(D1)
    assert plan.assign(0.0) == [(D1, B)]
    plan.learn(A, have=EVERY, reported_active=0)  # a fresh have does not bring it back
    plan.stored(D1)
    assert plan.is_complete and plan.bytes_left == 0
    assert plan.dropped() == {A: "StoreSourceMismatch"}


@pytest.mark.parametrize(
    ("drops", "blocked"),
    [
        ((), None),
        ((A,), None),
        ((A, B), NO_PEER_LEFT),
    ],
)
def test_no_peer_left_only_once_every_peer_was_dropped(
    drops: tuple[str, ...], blocked: str | None
) -> None:
    plan = schedule({D1: 5}, {A: (EVERY, 0), B: (EVERY, 0)})
    for address in drops:
        plan.drop(address, "PeerUnreachable")
    assert plan.blocked() == blocked


def test_no_peers_at_all_is_no_peer_left() -> None:
    assert schedule({D1: 5}, {}).blocked() == NO_PEER_LEFT
    assert schedule({}, {}).blocked() is None  # nothing needed: complete


def test_a_busy_peer_waits_for_its_retry_after() -> None:
    plan = schedule({D1: 5}, {A: (EVERY, 0), B: (EVERY, 3)})
    plan.defer(A, 12.0)  # 429/503 with Retry-After
    assert plan.next_retry_s(10.0) == 12.0
    assert plan.assign(10.0) == [(D1, B)]
    plan.returned(D1)
    plan.defer(B, 20.0)
    assert plan.assign(11.0) == []
    assert plan.blocked() is None  # busy is not gone
    assert plan.assign(12.0) == [(D1, A)]


def test_a_blob_nobody_has_yet_waits_for_the_next_have() -> None:
    plan = schedule({D1: 5, D2: 7}, {A: (frozenset({D1}), 0)})
    assert plan.assign(0.0) == [(D1, A)]
    plan.stored(D1)
    assert plan.assign(1.0) == []
    assert plan.blocked() is None and plan.bytes_left == 7
    plan.learn(A, have=frozenset({D1, D2}), reported_active=0)  # A fetched it meanwhile
    assert plan.assign(2.0) == [(D2, A)]


def test_held_digests_reads_the_have_bitmap_in_digest_order() -> None:
    ordered = sorted([D3, D1, D4, D2])
    have = have_of("sha256:" + "f" * 64, ordered, {D2, D4}, {D1, D4})
    assert held_digests(have, ordered) == {D2, D4}
    assert fetching_digests(have, ordered) == {D1}  # a stored blob is not fetching


PEERS = (A, B, C)
DIGESTS = (D1, D2, D3, D4)
_op = st.one_of(
    st.tuples(st.just("assign"), st.floats(0, 100)),
    st.tuples(st.just("drop"), st.sampled_from(PEERS)),
    st.tuples(st.just("defer"), st.sampled_from(PEERS), st.floats(0, 100)),
    st.tuples(
        st.just("learn"),
        st.sampled_from(PEERS),
        st.sets(st.sampled_from(DIGESTS)),
        st.integers(0, 8),
    ),
    st.tuples(st.just("end"), st.booleans()),
)


@settings(max_examples=300, deadline=None, database=None)
@given(concurrency=st.integers(1, 6), ops=st.lists(_op, max_size=40), seed=st.integers(0, 9))
def test_the_schedule_never_breaks_its_bounds(
    concurrency: int, ops: list[tuple[Any, ...]], seed: int
) -> None:
    """Whatever happens: at most ``concurrency`` in flight and ``PER_PEER`` per peer, never
    to a dropped or deferred peer nor for a blob the peer does not have, each blob once."""
    peers = {p: (EVERY, 0) for p in PEERS}
    plan = schedule(dict.fromkeys(DIGESTS, 1), peers, concurrency=concurrency, seed=seed)
    for op in ops:
        if op[0] == "assign":
            now = float(op[1])
            for digest, address in plan.assign(now):
                peer = plan.peers[address]
                assert peer.dropped is None and now >= peer.skip_until_s
                assert digest in peer.have and digest in plan.needed
        elif op[0] == "drop":
            plan.drop(op[1], "PeerUnreachable")
        elif op[0] == "defer":
            plan.defer(op[1], op[2])
        elif op[0] == "learn":
            plan.learn(op[1], have=frozenset(op[2]), reported_active=op[3])
        elif plan.in_flight:
            digest = sorted(plan.in_flight)[0]
            if op[1]:
                plan.stored(digest)
            else:
                plan.returned(digest)
        assert len(plan.in_flight) <= concurrency
        per_peer = Counter(plan.in_flight.values())
        assert all(n <= PER_PEER for n in per_peer.values())
        assert all(plan.peers[a].in_flight == per_peer[a] for a in PEERS)
        assert set(plan.in_flight) <= set(plan.needed)
        if plan.blocked() is not None:
            assert not plan.in_flight and all(p.dropped for p in plan.peers.values())


def test_a_peer_saying_it_is_idle_is_not_preferred_once_it_failed_or_sent_slowly() -> None:
    """``uploads.active`` is a hint: a peer reporting 0 (a lie, or the truth of a peer that
    cannot send) loses to a busy one this node measured fast, or to any once it failed."""
    plan = schedule({D1: 10}, {A: (EVERY, 0), B: (EVERY, 2)})
    plan.standings.served(A, 64 << 10, 1.0)  # A: 64 KiB/s
    plan.standings.served(B, 10 << 20, 1.0)  # B: 10 MiB/s
    assert plan.assign(0.0) == [(D1, B)]
    plan = schedule({D1: 10}, {A: (EVERY, 0), B: (EVERY, 2)})
    plan.standings.failed(A, 0.0)
    assert plan.assign(0.0) == [(D1, B)]


def test_a_reported_load_is_believed_up_to_the_uploads_the_peer_says_it_serves() -> None:
    plan = schedule({D1: 10}, {})
    for address, active in ((A, 200), (B, 3)):
        plan.add_peer(address)
        plan.learn(address, have=EVERY, reported_active=active, uploads_max=3)
    assert plan.peers[A].load == 3 == plan.peers[B].load


def test_a_demoted_peer_waits_while_a_busy_peer_has_the_blob_and_helps_when_none_has() -> None:
    plan = schedule({D1: 10, D2: 10, D3: 10}, {A: (frozenset({D1, D2}), 0), B: (EVERY, 0)})
    plan.standings.failed(B, 0.0)
    started = dict(plan.assign(0.0))
    assert started[D3] == B  # only B has it
    assert {started.get(D1), started.get(D2)} <= {A, None}  # A's, even when A is full


def test_a_demoted_peer_waits_for_the_first_have_of_the_others() -> None:
    plan = FetchSchedule.start({D1: 10}, [A, B], concurrency=2, rng=random.Random(0))  # noqa: S311
    plan.standings.failed(B, 0.0)
    plan.learn(B, have=EVERY, reported_active=0)
    assert plan.assign(0.0) == []  # A has not said what it has yet
    plan.learn(A, have=frozenset(), reported_active=0)
    assert plan.assign(0.0) == [(D1, B)]  # A has none: the demoted peer helps


def test_the_standings_handed_in_are_the_ones_used_even_when_empty() -> None:
    """An empty ``PeerStandings`` is falsy (it has a length): it must still be shared."""
    standings = PeerStandings()
    plan = FetchSchedule.start({D1: 10}, [A], concurrency=1, standings=standings)
    assert plan.standings is standings
