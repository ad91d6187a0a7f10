"""Which signed manifests the fetcher looks at, in which order (``nodeagent.site.offers``)."""

from __future__ import annotations

import random
from collections import Counter

from nodeagent.site.offers import offers

HONEST, FAKE, OTHER = (f"sha256:{c * 64}" for c in "1f2")
A, B, C, LIAR = "10.0.0.1:9447", "10.0.0.2:9447", "10.0.0.3:9447", "10.0.0.66:9447"


def seeded(seed: int) -> random.Random:
    return random.Random(seed)  # noqa: S311  (a seeded test)


def test_every_digest_of_a_bundle_id_is_offered() -> None:
    views = {A: [("x", HONEST)], LIAR: [("x", FAKE)], B: [("y", OTHER)]}
    found = offers(views, rng=seeded(1))
    assert sorted((o.bundle_id, o.manifest_digest) for o in found) == [
        ("x", HONEST),
        ("x", FAKE),
        ("y", OTHER),
    ]


def test_a_liar_whose_digest_sorts_first_does_not_win_every_tie() -> None:
    """1:1, the old rule took the largest digest: the liar's ``sha256:fff…`` every time."""
    views = {A: [("x", HONEST)], LIAR: [("x", FAKE)]}
    firsts = Counter(offers(views, rng=seeded(seed))[0].manifest_digest for seed in range(200))
    assert firsts[HONEST] > 60 and firsts[FAKE] > 60, firsts


def test_more_holders_first_and_a_digest_verified_before_first_of_all() -> None:
    views = {A: [("x", HONEST)], B: [("x", HONEST)], LIAR: [("x", FAKE)], C: [("x", FAKE)]}
    views[C] = [("x", HONEST)]
    assert [o.manifest_digest for o in offers(views, rng=seeded(0))] == [HONEST, FAKE]
    assert [o.manifest_digest for o in offers(views, rng=seeded(0), verified={FAKE})] == [
        FAKE,
        HONEST,
    ]


def test_a_pair_that_failed_from_a_peer_is_not_asked_from_it_again() -> None:
    views = {A: [("x", HONEST)], LIAR: [("x", HONEST)], C: [("x", FAKE)]}
    failed = {HONEST: frozenset({LIAR}), FAKE: frozenset({C})}
    (offer,) = offers(views, rng=seeded(0), failed_from=lambda d: failed.get(d, ()))
    assert (offer.manifest_digest, offer.holders) == (HONEST, (A,))


def test_a_bad_digest_is_never_offered_and_one_only_demoted_peers_hold_waits() -> None:
    views = {A: [("x", HONEST)], LIAR: [("x", FAKE), ("z", OTHER)]}
    found = offers(views, rng=seeded(0), bad={FAKE}, is_demoted=lambda a: a == LIAR)
    assert [(o.bundle_id, o.manifest_digest) for o in found] == [("x", HONEST)]


def test_demoted_holders_are_asked_last() -> None:
    views = {A: [("x", HONEST)], LIAR: [("x", HONEST)], B: [("x", HONEST)]}
    for seed in range(20):
        (offer,) = offers(views, rng=seeded(seed), is_demoted=lambda a: a == LIAR)
        assert offer.holders[-1] == LIAR and set(offer.holders) == {A, B, LIAR}
