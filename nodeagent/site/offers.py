"""Which signed manifests to look at, in which order, from whom (pure; docs/decisions/0053).

The peers' holdings say, per bundle id, which manifest digest each holds. A peer is never
trusted, so a digest most peers hold is not "the" bundle: a node with a valid certificate
can publish any bundle id under a digest of its own. ``offers`` therefore returns **every**
digest offered for an id (its signature decides), ordered so that a liar cannot make the
honest one wait behind its own every time:

1. a digest this node verified before (its signature checked out) comes first;
2. then the one most peers not demoted hold, then most peers in all;
3. ties broken at random (not by digest: a liar could pick a digest that sorts first).

A digest is left out when it is known bad (its signed content is invalid), when every
holder already sent a pair that failed for it (``failed_from``: the pair, not the digest,
is what failed, since a liar may pair the honest manifest with a broken signature), or when
only demoted peers offer it (looked at again when their demotion ends). Within an offer
the holders not demoted come first, in random order, then the demoted ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Offer:
    """One signed manifest of a bundle id as the peers offer it, and who to ask for it."""

    bundle_id: str
    manifest_digest: str
    holders: tuple[str, ...]


def offers(
    views: Mapping[str, Sequence[tuple[str, str]]],
    *,
    rng: random.Random,
    bad: Container[str] = (),
    verified: Container[str] = (),
    failed_from: Callable[[str], Container[str]] = lambda _digest: (),
    is_demoted: Callable[[str], bool] = lambda _address: False,
) -> list[Offer]:
    """Peer address → (bundle id, manifest digest) it holds, as offers: by bundle id, each
    id's digests in the order to try them."""
    by_id: dict[str, dict[str, list[str]]] = {}
    for address, held in views.items():
        for bundle_id, digest in held:
            by_id.setdefault(bundle_id, {}).setdefault(digest, []).append(address)
    found = []
    for bundle_id in sorted(by_id):
        ranked = []
        for digest, holders in sorted(by_id[bundle_id].items()):
            if digest in bad:
                continue
            failed = failed_from(digest)
            usable = sorted(a for a in holders if a not in failed)
            fresh = [a for a in usable if not is_demoted(a)]
            if not fresh:
                continue
            demoted = [a for a in usable if a not in fresh]
            rng.shuffle(fresh)
            rng.shuffle(demoted)
            key = (digest not in verified, -len(fresh), -len(usable), rng.random())
            ranked.append((key, Offer(bundle_id, digest, (*fresh, *demoted))))
        found += [offer for _, offer in sorted(ranked, key=lambda kv: kv[0])]
    return found
