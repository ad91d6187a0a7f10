"""What this node measured of its peers, across fetches (pure; docs/decisions/0053).

A peer is never trusted, and what it says of itself (``uploads.active``) is a hint at
most. The fetcher keeps, per peer address, what it saw that peer do:

* ``PeerStandings.failed``: the peer sent a manifest that failed its signature, wrong
  bytes, a garbage answer, was too slow or failed: it is *demoted* for 60 s, doubling
  with each failure up to an hour. A demoted peer is asked last (for a manifest, for a
  blob), and a bundle only demoted peers offer is not looked at until one is not.
* ``PeerStandings.served``: a blob came whole: its rate (bytes a second, a moving average)
  and one failure forgiven.
* ``PeerStandings.seconds_per_blob``: what the scheduler compares: the expected time of one
  more request to the peer, from its measured rate (the median of the measured peers
  for one not measured yet) and its load (our requests in flight plus its reported
  ``uploads.active``, clamped to its ``uploads.max``). A peer that says 0 but sends slowly
  is not preferred over a fast one.

Every table here is an ``Lru``: bounded, the entry used longest ago forgotten first, so a
site of many peers (or a peer inventing digests) cannot grow the fetcher's memory.
Clock-free: the caller passes the time.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

MAX_PEERS: Final = 1024
"""Peers remembered (a site has at most a few hundred: ``[site] peers`` is at most 256)."""
DEMOTE_S: Final = (60.0, 3600.0)
"""A failing peer is demoted for the first, doubling with each failure up to the second."""
RATE_WEIGHT: Final = 0.3
"""Weight of the newest blob's rate in a peer's moving average."""


class Lru(Generic[K, V]):
    """A mapping of at most ``max_items``; setting one more forgets the least recently used."""

    def __init__(self, max_items: int) -> None:
        if max_items < 1:
            raise ValueError("an Lru holds at least one item")
        self.max_items = max_items
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._items.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._items))

    def items(self) -> list[tuple[K, V]]:
        return list(self._items.items())


@dataclass(slots=True)
class Standing:
    """What this node saw one peer do."""

    failures: int = 0
    demoted_until_s: float = 0.0
    rate_bytes_s: float | None = None
    """Moving average of the rates its blobs came at; None until one came whole."""


class PeerStandings:
    """Every peer's standing, bounded (``MAX_PEERS``)."""

    def __init__(self, max_peers: int = MAX_PEERS, demote_s: tuple[float, float] = DEMOTE_S):
        self._peers: Lru[str, Standing] = Lru(max_peers)
        self.demote_s = demote_s

    def __len__(self) -> int:
        return len(self._peers)

    def of(self, address: str) -> Standing:
        found = self._peers.get(address)
        if found is None:
            found = Standing()
            self._peers[address] = found
        return found

    def failed(self, address: str, now_s: float) -> float:
        """The peer did something wrong: demoted; the seconds it is demoted for."""
        standing = self.of(address)
        standing.failures = min(standing.failures + 1, 32)
        first, most = self.demote_s
        seconds = float(min(most, first * 2 ** (standing.failures - 1)))
        standing.demoted_until_s = max(standing.demoted_until_s, now_s + seconds)
        return seconds

    def served(self, address: str, size_bytes: int, seconds: float) -> None:
        """A blob of ``size_bytes`` came whole from the peer in ``seconds``."""
        standing = self.of(address)
        rate = size_bytes / max(seconds, 1e-3)
        old = standing.rate_bytes_s
        standing.rate_bytes_s = rate if old is None else old + RATE_WEIGHT * (rate - old)
        standing.failures = max(0, standing.failures - 1)

    def is_demoted(self, address: str, now_s: float) -> bool:
        found = self._peers.get(address)
        return found is not None and now_s < found.demoted_until_s

    def rate_bytes_s(self, address: str, known: list[float] | None = None) -> float:
        """The peer's measured rate; for one not measured, the median of ``known`` (the
        other candidates' measured rates), or 1 when none is known (all equal then)."""
        found = self._peers.get(address)
        if found is not None and found.rate_bytes_s is not None:
            return found.rate_bytes_s
        return float(statistics.median(known)) if known else 1.0

    def measured(self, addresses: list[str]) -> list[float]:
        rates = [self._peers.get(a) for a in addresses]
        return [s.rate_bytes_s for s in rates if s is not None and s.rate_bytes_s is not None]

    def seconds_per_blob(
        self, address: str, load: int, known: list[float], now_s: float
    ) -> tuple[bool, float]:
        """Sort key of a peer for one more blob: demoted ones last, then the expected time of
        one more request behind ``load`` others at its measured (or the median) rate."""
        return (self.is_demoted(address, now_s), (load + 1) / self.rate_bytes_s(address, known))
