"""Digests asked of the node mirror that the store does not hold: counted, logged at most
once a minute per digest, the table bounded."""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

LOG_EVERY_S: Final = 60.0
"""A digest asked for again is logged again only after this long."""
MAX_TRACKED: Final = 1024
"""Digests remembered (the oldest forgotten beyond it; the total count is kept)."""


class Misses:
    """Counts the misses; ``note`` says whether this one is to be logged."""

    def __init__(self, *, log_every_s: float = LOG_EVERY_S, max_tracked: int = MAX_TRACKED):
        self._every_s, self._max = log_every_s, max_tracked
        self._last: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self.total = 0
        """Misses since start."""

    def note(self, digest: str, now_s: float) -> int | None:
        """Count a miss of ``digest``; the misses of it since it was last logged when it is to
        be logged now, else None."""
        self.total += 1
        last = self._last.pop(digest, None)
        if last is not None and now_s - last[0] < self._every_s:
            self._last[digest] = (last[0], last[1] + 1)
            return None
        self._last[digest] = (now_s, 0)
        while len(self._last) > self._max:
            self._last.popitem(last=False)
        return 1 + (0 if last is None else last[1])

    def recent(self, limit: int = 16) -> tuple[str, ...]:
        """The digests missed most recently, newest first (for status)."""
        return tuple(list(reversed(self._last))[:limit])
