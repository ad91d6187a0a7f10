"""Which blob to fetch from which peer (pure; docs/site.md, "Fetch").

``FetchSchedule`` holds, for one bundle, the blobs still needed and what is known of each
peer: which of the bundle's blobs it has (its ``have``, refreshed every few seconds while
the fetch runs), how busy it says it is (``uploads.active`` of its holdings) and how many
of our requests are in flight to it. ``assign`` hands out blobs:

* at most ``concurrency`` blobs in flight, at most what one peer takes from one client
  (``limits.per_peer`` of the ``uploads.max`` it publishes; a request more is answered 429);
* rarest first (the blob fewest usable peers have, each peer fetching it counting as two
  more), so what only one peer holds moves on early and the others can re-serve it, and
  nodes fetching side by side take different blobs from the node that has them all (a blob
  another node is fetching from it now is taken later, from that node, rather than sent
  out twice: ``have``'s ``fetching``);
* for each blob, a peer that has it and would send it soonest by what this node measured
  (``standing.PeerStandings.seconds_per_blob``: demoted peers last, then our requests in
  flight to it plus its own ``uploads.active``, a hint clamped to its ``uploads.max``, at
  its measured rate), ties broken at random: a peer that says it is idle but failed or
  sends slowly is not preferred, and a demoted one is asked only for a blob no other
  peer has;
* a peer that was dropped (wrong bytes, a failure, a timeout, a garbage answer) is never
  asked again for this bundle; one that answered 429/503 is skipped until its
  ``Retry-After``; a blob no usable peer has yet waits for the next ``have`` refresh.

``blocked`` says why nothing can move: ``NoPeerLeft`` once every peer was dropped (the
fetch fails and is tried again later), None while a peer may still help.
Clock-free: the caller passes the time.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from nodeagent.bundles.manifest import BundleManifest
from nodeagent.site.holdings import Have
from nodeagent.site.limits import PER_PEER, per_peer
from nodeagent.site.standing import PeerStandings

NO_PEER_LEFT: Final = "NoPeerLeft"


@dataclass(frozen=True, slots=True)
class SignedBundle:
    """A bundle manifest whose signature verified against this node's own keys."""

    manifest: BundleManifest
    manifest_digest: str
    """``sha256:<hex>`` of ``data``."""
    data: bytes
    signature: bytes | None
    """``bundle.json.minisig`` as verified; None when the bundle has none (or, on a host in
    FIPS mode, when it was not looked at: decision 0075)."""
    key_id_hex: str
    key_name: str
    ecdsa_signature: bytes | None = None
    """``bundle.json.ecdsa-sig`` as verified; None when the bundle has none."""
    linked: tuple[str, ...] = ()
    """The other key that signed it (``ecdsa_signature.ManifestVerified.linked``)."""

    @property
    def signed_by(self) -> str:
        return f"{self.key_name or self.key_id_hex} ({self.key_id_hex})"


@dataclass(slots=True)
class PeerState:
    """What the fetch knows of one peer."""

    address: str
    reported_active: int = 0
    """``uploads.active`` of its last holdings (0 until known)."""
    allowed: int = PER_PEER
    """Requests it takes from one peer at once (``limits.per_peer`` of its ``uploads.max``):
    a request more would only be answered 429 and the peer skipped for its Retry-After."""
    have: frozenset[str] = frozenset()
    """Digests of this bundle's blobs it has, from its last ``have``."""
    fetching: frozenset[str] = frozenset()
    """Digests of this bundle's blobs it is fetching now, from its last ``have``."""
    in_flight: int = 0
    skip_until_s: float = 0.0
    dropped: str | None = None
    """Why it was dropped for this bundle; None while it may be asked."""

    has_answered: bool = False
    """Whether its ``have`` (or holdings without this bundle) came at least once."""
    reported_max: int = PER_PEER
    """``uploads.max`` of its last holdings: its ``uploads.active`` is believed up to this."""

    @property
    def load(self) -> int:
        return min(self.reported_active, self.reported_max) + self.in_flight

    def is_usable(self, now_s: float) -> bool:
        return self.dropped is None and now_s >= self.skip_until_s and self.in_flight < self.allowed


def held_digests(have: Have, ordered: Sequence[str]) -> frozenset[str]:
    """The digests a ``have`` marks, ``ordered`` being the manifest's blobs sorted by digest
    (the caller checked that the counts agree)."""
    return frozenset(digest for index, digest in enumerate(ordered) if have.is_held(index))


def fetching_digests(have: Have, ordered: Sequence[str]) -> frozenset[str]:
    """The digests a ``have`` marks as being fetched (same layout as ``held_digests``)."""
    return frozenset(digest for index, digest in enumerate(ordered) if have.is_fetching(index))


@dataclass(slots=True)
class FetchSchedule:
    """One bundle's fetch: blobs needed, peers, requests in flight."""

    needed: dict[str, int]
    """Digest → size of every blob not stored yet (those in flight included)."""
    peers: dict[str, PeerState]
    concurrency: int
    rng: random.Random = field(default_factory=random.Random)
    in_flight: dict[str, str] = field(default_factory=dict)
    """Digest → peer address it is being fetched from."""
    rank: dict[str, float] = field(default_factory=dict)
    """Digest → a random rank drawn once per fetch: blobs equally rare are taken in a
    different order on each node, so nodes fetching side by side hold different blobs to
    give each other (in digest order they all asked node 0 for the same ones: bench/fanout
    measured 19-26 % of bytes re-served with 4-8 nodes)."""
    standings: PeerStandings = field(default_factory=PeerStandings)
    """What this node measured of each peer (kept across fetches by the fetcher)."""

    @classmethod
    def start(
        cls,
        needed: Mapping[str, int],
        peers: Iterable[str],
        *,
        concurrency: int,
        rng: random.Random | None = None,
        standings: PeerStandings | None = None,
    ) -> FetchSchedule:
        return cls(
            dict(needed),
            {address: PeerState(address) for address in peers},
            max(1, concurrency),
            rng or random.Random(),  # noqa: S311  (spreading load, not secrecy)
            standings=PeerStandings() if standings is None else standings,
        )

    # ------------------------------------------------------------ what is known
    def add_peer(self, address: str) -> None:
        self.peers.setdefault(address, PeerState(address))

    def forget(self, address: str) -> None:
        """``address`` is not a peer (this node itself): never asked, nothing in flight."""
        peer = self.peers.get(address)
        if peer is not None and not peer.in_flight:
            del self.peers[address]

    def learn(
        self,
        address: str,
        *,
        have: frozenset[str],
        reported_active: int,
        fetching: frozenset[str] = frozenset(),
        uploads_max: int | None = None,
    ) -> None:
        """A peer's fresh ``have`` (held and being fetched), load and upload limit."""
        peer = self.peers.get(address)
        if peer is not None and peer.dropped is None:
            peer.have, peer.reported_active = have, reported_active
            peer.has_answered = True
            peer.fetching = fetching
            if uploads_max is not None:
                peer.allowed = per_peer(uploads_max)
                peer.reported_max = uploads_max

    def drop(self, address: str, reason: str) -> bool:
        """Never ask ``address`` again for this bundle; False when it already was dropped."""
        peer = self.peers.get(address)
        if peer is None or peer.dropped is not None:
            return False
        peer.dropped = reason
        return True

    def defer(self, address: str, until_s: float) -> None:
        """429/503: skip the peer until its ``Retry-After``."""
        peer = self.peers.get(address)
        if peer is not None:
            peer.skip_until_s = max(peer.skip_until_s, until_s)

    # ------------------------------------------------------------ blobs
    def assign(self, now_s: float) -> list[tuple[str, str]]:
        """(digest, peer) pairs to start now; each is marked in flight."""
        started: list[tuple[str, str]] = []
        for digest in self._waiting_rarest_first(now_s):
            if len(self.in_flight) >= self.concurrency:
                break
            peer = self._least_busy(digest, now_s)
            if peer is None:
                continue
            peer.in_flight += 1
            self.in_flight[digest] = peer.address
            started.append((digest, peer.address))
        return started

    def _waiting_rarest_first(self, now_s: float) -> list[str]:
        usable = [p for p in self.peers.values() if p.is_usable(now_s)]
        waiting = [d for d in self.needed if d not in self.in_flight]
        holders = {d: sum(1 for p in usable if d in p.have) for d in waiting}
        fetchers = {
            d: sum(1 for p in self.peers.values() if p.dropped is None and d in p.fetching)
            for d in waiting
        }
        rank = {d: self.rank.setdefault(d, self.rng.random()) for d in waiting}

        def order(d: str) -> tuple[bool, bool, int, float]:
            # last: none has it; then one alone has it and another node is fetching it from
            # there (it would leave that peer twice: take it from the other node later)
            alone = holders[d] == 1 and fetchers[d] > 0
            return (holders[d] == 0, alone, holders[d] + 2 * fetchers[d], rank[d])

        return sorted(waiting, key=order)

    def _least_busy(self, digest: str, now_s: float) -> PeerState | None:
        holders = [p for p in self.peers.values() if p.dropped is None and digest in p.have]
        fresh = [p for p in holders if not self.standings.is_demoted(p.address, now_s)]
        if not fresh and not self._others_answered(now_s):
            return None  # a peer not demoted may have it: wait for its first have
        # a demoted peer only for a blob no other peer has (not when those are busy)
        candidates = [p for p in fresh or holders if p.is_usable(now_s)]
        if not candidates:
            return None
        known = self.standings.measured([p.address for p in candidates])
        keyed = [
            (self.standings.seconds_per_blob(p.address, p.load, known, now_s), p)
            for p in candidates
        ]
        best = min(key for key, _ in keyed)
        tied = sorted((p for key, p in keyed if key == best), key=lambda p: p.address)
        return self.rng.choice(tied)

    def has_other_holder(self, digest: str, address: str) -> bool:
        """Whether a peer other than ``address``, not dropped, holds ``digest``."""
        return any(
            p.address != address and p.dropped is None and digest in p.have
            for p in self.peers.values()
        )

    def _others_answered(self, now_s: float) -> bool:
        """Whether every peer not dropped nor demoted told its ``have`` at least once."""
        return all(
            p.has_answered
            for p in self.peers.values()
            if p.dropped is None and not self.standings.is_demoted(p.address, now_s)
        )

    def _release(self, digest: str) -> str | None:
        address = self.in_flight.pop(digest, None)
        peer = None if address is None else self.peers.get(address)
        if peer is not None:
            peer.in_flight -= 1
        return address

    def stored(self, digest: str) -> None:
        """The blob is in the store (verified)."""
        self._release(digest)
        self.needed.pop(digest, None)

    def returned(self, digest: str) -> None:
        """The blob was not fetched (its peer failed, refused or was dropped): it waits."""
        self._release(digest)

    # ------------------------------------------------------------ progress
    @property
    def is_complete(self) -> bool:
        return not self.needed

    @property
    def bytes_left(self) -> int:
        return sum(self.needed.values())

    def blocked(self) -> str | None:
        """``NoPeerLeft`` when every peer was dropped (or there is none) and blobs are still
        needed; None while the fetch can go on or wait."""
        if self.is_complete or self.in_flight:
            return None
        if all(p.dropped is not None for p in self.peers.values()):
            return NO_PEER_LEFT
        return None

    def next_retry_s(self, now_s: float) -> float | None:
        """The earliest time a deferred peer may be asked again (None: none is deferred)."""
        times = [
            p.skip_until_s
            for p in self.peers.values()
            if p.dropped is None and p.skip_until_s > now_s
        ]
        return min(times) if times else None

    def dropped(self) -> dict[str, str]:
        return {a: p.dropped for a, p in self.peers.items() if p.dropped is not None}
