"""What the peer server's process tells the daemon, and how much of it the daemon acts on.

The peer server runs in its own unprivileged process (``nodeagent serve-peers``, decision
0056): it reads the store and cannot change it. What it finds, it reports to the daemon in
one datagram per fact on a unix socket only its group can write to
(``nodeagent.adapters.peer_reports``):

- ``corrupt sha256:<64 hex>``: a blob failed its digest while it was being served;
- ``served <bytes>``: bytes sent to peers since the last report (the metrics);
- ``mirror on|off <blobs> <registry blobs> <requests> <bytes> <missing> <denied>``: the node
  mirror's state, every report interval (counts since the peer process started; decision
  0057); ``missing sha256:<64 hex>``: a digest a local client asked of it that the store
  does not hold (at most once a minute per digest). Status, and a missing digest wakes
  the site fetcher (decision 0061); the digest itself picks nothing.

A report is a claim, never proof: the daemon hashes the blob again itself (``keeper.
set_aside_corrupt``, under the store's lock) and removes it only when it really is damaged.
``ReportGate`` bounds that work whatever arrives: a digest is checked at most once per
``RECHECK_AFTER_S``, at most ``MAX_QUEUED`` digests wait, and checks are paced by a token
bucket (``CHECK_BURST`` at once, then one per ``CHECK_EVERY_S``). Anything else is refused
with a reason and counted.

Pure: no I/O; the time is passed in.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final, Literal

from nodeagent.mirror.state import MirrorReport as MirrorReport

MAX_REPORT_BYTES: Final = 128
"""Longest datagram read; a longer one is refused (the longest valid one is 79 bytes)."""
MAX_SERVED_BYTES: Final = 1 << 44
"""Largest ``served`` count accepted in one report (16 TiB: more than 15 s of any link)."""
RECHECK_AFTER_S: Final = 600.0
"""A digest checked (sound, missing or removed) is not checked again for 10 minutes: a
peer process reporting the same sound blob over and over costs one hash per 10 minutes."""
MAX_QUEUED: Final = 64
"""Digests waiting for their check; beyond, a report is refused (``queue_full``); the peer
process reports again when it serves the blob again."""
CHECK_BURST: Final = 8
CHECK_EVERY_S: Final = 30.0
"""Checks are paced: ``CHECK_BURST`` at once, then one per 30 s (each hashes one blob, up
to the largest layer: seconds of one core and the disk's read bandwidth)."""
MAX_REMEMBERED: Final = 4096
"""Digests remembered as checked (oldest forgotten first): bounded memory."""

_CORRUPT = re.compile(rb"corrupt (sha256:[0-9a-f]{64})")
_SERVED = re.compile(rb"served ([1-9][0-9]{0,14})")
_COUNT = rb"(0|[1-9][0-9]{0,14})"
_MIRROR = re.compile(rb"mirror (on|off)" + rb" " + rb" ".join([_COUNT] * 6))
_MISSING = re.compile(rb"missing (sha256:[0-9a-f]{64})")

Refusal = Literal["malformed", "queue_full", "recently_checked", "queued_already"]


@dataclass(frozen=True, slots=True)
class CorruptReport:
    digest: str


@dataclass(frozen=True, slots=True)
class ServedReport:
    size_bytes: int


@dataclass(frozen=True, slots=True)
class MissingReport:
    digest: str


Report = CorruptReport | ServedReport | MirrorReport | MissingReport


def render_mirror(report: MirrorReport) -> bytes:
    counts = (
        report.blobs,
        report.registry_blobs,
        report.requests,
        min(report.bytes_served, MAX_SERVED_BYTES),
        report.missing,
        report.denied,
    )
    state = "on" if report.serving else "off"
    return " ".join(["mirror", state, *(str(min(c, 10**15 - 1)) for c in counts)]).encode()


def render_missing(digest: str) -> bytes:
    return f"missing {digest}".encode("ascii")


def render_corrupt(digest: str) -> bytes:
    return f"corrupt {digest}".encode("ascii")


def render_served(size_bytes: int) -> bytes:
    return f"served {size_bytes}".encode("ascii")


def parse_report(data: bytes) -> Report | None:
    """The report a datagram holds, or None when it is not exactly one (strict: full match,
    lowercase hex, a served count from 1 to ``MAX_SERVED_BYTES``)."""
    if len(data) > MAX_REPORT_BYTES:
        return None
    corrupt = _CORRUPT.fullmatch(data)
    if corrupt is not None:
        return CorruptReport(corrupt.group(1).decode("ascii"))
    served = _SERVED.fullmatch(data)
    if served is not None:
        size = int(served.group(1))
        return ServedReport(size) if size <= MAX_SERVED_BYTES else None
    missing = _MISSING.fullmatch(data)
    if missing is not None:
        return MissingReport(missing.group(1).decode("ascii"))
    mirror = _MIRROR.fullmatch(data)
    if mirror is not None:
        counts = [int(group) for group in mirror.groups()[1:]]
        return MirrorReport(mirror.group(1) == b"on", *counts)
    return None


@dataclass
class ReportGate:
    """Which reported digests the daemon checks, and when (bounded work, see the module)."""

    now_s: float
    recheck_after_s: float = RECHECK_AFTER_S
    max_queued: int = MAX_QUEUED
    burst: int = CHECK_BURST
    every_s: float = CHECK_EVERY_S
    _queued: OrderedDict[str, None] = field(default_factory=OrderedDict)
    _checked: OrderedDict[str, float] = field(default_factory=OrderedDict)
    _tokens: float = field(init=False)
    refused: dict[str, int] = field(default_factory=dict)
    """Reports refused so far, by reason."""

    def __post_init__(self) -> None:
        self._tokens = float(self.burst)

    def offer(self, digest: str, now_s: float) -> Refusal | None:
        """Queue ``digest`` for a check; the reason when it is not."""
        refusal = self._refusal(digest, now_s)
        if refusal is not None:
            self.refused[refusal] = self.refused.get(refusal, 0) + 1
            return refusal
        self._queued[digest] = None
        return None

    def refuse(self, reason: Refusal) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def _refusal(self, digest: str, now_s: float) -> Refusal | None:
        if digest in self._queued:
            return "queued_already"
        checked_at = self._checked.get(digest)
        if checked_at is not None and now_s - checked_at < self.recheck_after_s:
            return "recently_checked"
        if len(self._queued) >= self.max_queued:
            return "queue_full"
        return None

    def next_check(self, now_s: float) -> tuple[str | None, float]:
        """The digest to check now (taken from the queue, remembered as checked), or None
        and the seconds until one may be (``inf`` when nothing waits)."""
        self._refill(now_s)
        if not self._queued:
            return None, float("inf")
        if self._tokens < 1:
            return None, (1 - self._tokens) * self.every_s
        self._tokens -= 1
        digest, _ = self._queued.popitem(last=False)
        self._checked[digest] = now_s
        self._checked.move_to_end(digest)
        while len(self._checked) > MAX_REMEMBERED:
            self._checked.popitem(last=False)
        return digest, 0.0

    @property
    def queued(self) -> int:
        return len(self._queued)

    def _refill(self, now_s: float) -> None:
        elapsed = max(0.0, now_s - self.now_s)
        self.now_s = max(self.now_s, now_s)
        self._tokens = min(float(self.burst), self._tokens + elapsed / self.every_s)
