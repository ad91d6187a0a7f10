"""The peer server's load bounds: upload slots per node and per peer, and a bandwidth cap.

Pure and clock-free: the caller passes the time. docs/site.md, "Load":

* ``UploadSlots``: at most ``max_uploads`` blob downloads at once (one more is answered
  503 with ``Retry-After``: the load signal that sends a peer elsewhere), at most
  ``PER_PEER`` of them for one client certificate (429 with ``Retry-After``);
* ``TokenBucket``: all uploads together under ``rate_bytes_s``; each send step reserves
  its bytes and waits what the reservation says, so steps are served in arrival order and
  the long-run rate is the cap (bursts up to ``burst_bytes``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Final, Literal

PER_PEER: Final = 2
"""Blob downloads one peer (client certificate) may have at once: at most this, and at most
half the node's ``max_uploads`` (at least one), so one peer never takes every slot."""
RETRY_AFTER_S: Final = 2
"""``Retry-After`` of a 503 or 429: soon, but after the download in progress moved on."""


def per_peer(max_uploads: int) -> int:
    """Blob downloads one peer may have at once from a node serving ``max_uploads``."""
    return max(1, min(PER_PEER, max_uploads // 2))


Refusal = Literal["busy", "too-many"]
"""503 (every slot taken) or 429 (this peer already holds ``PER_PEER``)."""


@dataclass(slots=True)
class UploadSlots:
    """Blob downloads in progress, in total and per peer."""

    max_uploads: int
    _by_peer: Counter[str] = field(default_factory=Counter)

    @property
    def active(self) -> int:
        return self._by_peer.total()

    @property
    def per_peer(self) -> int:
        return per_peer(self.max_uploads)

    def take(self, peer: str) -> Refusal | None:
        """Take a slot for ``peer``; None when taken, else why not (nothing taken then)."""
        if self._by_peer[peer] >= self.per_peer:
            return "too-many"
        if self.active >= self.max_uploads:
            return "busy"
        self._by_peer[peer] += 1
        return None

    def give_back(self, peer: str) -> None:
        if self._by_peer[peer] <= 0:
            raise ValueError("no upload slot of this peer is taken")
        self._by_peer[peer] -= 1
        if not self._by_peer[peer]:
            del self._by_peer[peer]


@dataclass(slots=True)
class TokenBucket:
    """``rate_bytes_s`` with bursts of ``burst_bytes``; starts full at ``now_s``."""

    rate_bytes_s: float
    burst_bytes: float
    now_s: float
    _tokens: float = field(init=False)

    def __post_init__(self) -> None:
        if self.rate_bytes_s <= 0 or self.burst_bytes <= 0:
            raise ValueError("a token bucket needs a positive rate and burst")
        self._tokens = self.burst_bytes

    def reserve(self, count: int, now_s: float) -> float:
        """Reserve ``count`` bytes at ``now_s``: the seconds to wait before sending them."""
        elapsed = max(0.0, now_s - self.now_s)
        self.now_s = max(self.now_s, now_s)
        self._tokens = min(self.burst_bytes, self._tokens + elapsed * self.rate_bytes_s)
        self._tokens -= count
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_bytes_s
