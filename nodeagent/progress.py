"""Progress in bytes: done of total, MB/s over a sliding window, time left; throttled.

``ProgressMeter`` is fed every chunk (``advance``) with the time of the call and answers a
``ByteProgress`` at most once per ``interval_s`` (and always at ``finish``), so a copy of
thousands of small blobs costs a few status updates, not one per blob. The rate is taken
over the last ``window_s`` seconds, so a stall shows within the window; with no rate yet
(the first interval) the time left is unknown (None), never zero.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from nodeagent.units import format_bytes

DEFAULT_INTERVAL_S: Final = 2.0
DEFAULT_WINDOW_S: Final = 10.0
SAMPLE_EVERY_S: Final = 0.25
"""Samples of the sliding window are at least this far apart (bounded memory)."""


@dataclass(frozen=True, slots=True)
class ByteProgress:
    done_bytes: int
    total_bytes: int
    rate_bytes_per_s: float | None
    """Over the sliding window; None until two samples lie apart in time."""
    eta_s: float | None
    """Seconds left at that rate; None when not known (no rate, or a rate of zero)."""
    elapsed_s: float
    is_final: bool = False

    @property
    def fraction(self) -> float:
        return 1.0 if self.total_bytes <= 0 else min(1.0, self.done_bytes / self.total_bytes)

    def describe(self) -> str:
        """``312 MiB of 1 GiB (30 %), 38.2 MB/s, about 18 s left``."""
        text = (
            f"{format_bytes(self.done_bytes)} of {format_bytes(self.total_bytes)} "
            f"({self.fraction * 100:.0f} %)"
        )
        if self.rate_bytes_per_s is not None:
            text += f", {self.rate_bytes_per_s / 1e6:.1f} MB/s"
        if self.eta_s is not None and not self.is_final:
            text += f", about {self.eta_s:.0f} s left"
        return text

    def to_json(self) -> dict[str, object]:
        rate = None if self.rate_bytes_per_s is None else round(self.rate_bytes_per_s)
        eta = None if self.eta_s is None else round(self.eta_s, 1)
        return {
            "doneBytes": self.done_bytes,
            "totalBytes": self.total_bytes,
            "bytesPerSecond": rate,
            "etaSeconds": eta,
            "elapsedSeconds": round(self.elapsed_s, 1),
        }


def eta_s(done_bytes: int, total_bytes: int, rate_bytes_per_s: float | None) -> float | None:
    if rate_bytes_per_s is None or rate_bytes_per_s <= 0:
        return None
    return max(0, total_bytes - done_bytes) / rate_bytes_per_s


class ProgressMeter:
    """Bytes of one job, from ``started_s``; the caller passes the time of every call."""

    def __init__(
        self,
        total_bytes: int,
        started_s: float,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        window_s: float = DEFAULT_WINDOW_S,
        done_bytes: int = 0,
    ) -> None:
        """``done_bytes``: already done before this job started (a resumed copy's partials)."""
        self.total_bytes = total_bytes
        self.done_bytes = done_bytes
        self.initial_bytes = done_bytes
        self.started_s = started_s
        self.interval_s = interval_s
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque([(started_s, done_bytes)])
        self._shown_s = started_s

    def advance(self, count: int, now_s: float) -> ByteProgress | None:
        """Count ``count`` more bytes; a value to show when ``interval_s`` has passed."""
        self.done_bytes += count
        if now_s - self._samples[-1][0] >= SAMPLE_EVERY_S:
            self._samples.append((now_s, self.done_bytes))
            while len(self._samples) > 2 and now_s - self._samples[1][0] >= self.window_s:
                self._samples.popleft()
        if now_s - self._shown_s < self.interval_s:
            return None
        self._shown_s = now_s
        return self.snapshot(now_s)

    def rate(self, now_s: float) -> float | None:
        first_s, first_bytes = self._samples[0]
        if now_s - first_s <= 0:
            return None
        return (self.done_bytes - first_bytes) / (now_s - first_s)

    def snapshot(self, now_s: float, *, is_final: bool = False) -> ByteProgress:
        rate = self.rate(now_s)
        if is_final and now_s > self.started_s:
            rate = (self.done_bytes - self.initial_bytes) / (now_s - self.started_s)  # average
        return ByteProgress(
            self.done_bytes,
            self.total_bytes,
            rate,
            eta_s(self.done_bytes, self.total_bytes, rate),
            now_s - self.started_s,
            is_final,
        )

    def finish(self, now_s: float) -> ByteProgress:
        return self.snapshot(now_s, is_final=True)


def new_blob_bytes(blobs: Iterable[tuple[str, int]], seen: set[str]) -> int:
    """Bytes of the blobs not in ``seen`` (added to it): a layer two images share counts once."""
    total = 0
    for digest, size in blobs:
        if digest not in seen:
            seen.add(digest)
            total += size
    return total


LOG_EVERY_S: Final = 30.0
LOG_EVERY_FRACTION: Final = 0.05


class ProgressLog:
    """When a long job's progress earns a journal line: ``every_s`` seconds AND ``every_fraction``
    of the job since its last line (or its start), whichever comes later, so a 16 GB copy at
    100 MB/s says where it is every 30 s and a slow one every 5 %, never a flood.

    Keyed by where the job runs (the caller's key: a bundle's source); ``job`` names what runs
    there (a step of a bundle): another job, or the same one started over (less done), counts
    from its own start. A job's first report starts its count and is not a line of its own
    (the job's start has one).
    """

    def __init__(
        self, every_s: float = LOG_EVERY_S, every_fraction: float = LOG_EVERY_FRACTION
    ) -> None:
        self.every_s = every_s
        self.every_fraction = every_fraction
        self._last: dict[object, tuple[object, float, float]] = {}
        """key -> (job, time, fraction) of the job's last line, or of its first report."""

    def is_due(self, key: object, job: object, fraction: float, now_s: float) -> bool:
        last = self._last.get(key)
        if last is None or last[0] != job or fraction < last[2]:
            self._last[key] = (job, now_s, fraction)
            return False
        if now_s - last[1] < self.every_s or fraction - last[2] < self.every_fraction:
            return False
        self._last[key] = (job, now_s, fraction)
        return True

    def forget(self, key: object) -> None:
        """The job at ``key`` ended: the next one counts from its own start."""
        self._last.pop(key, None)
