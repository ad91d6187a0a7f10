"""What the daemon knows of the node mirror: the mirror process's last report, the state of
its socket unit, and the digests asked for that the store lacks (the most recent
``MAX_RECENT_MISSING``).

The mirror process starts on the first connection (``nodeagent-mirror.socket``, decision
0063), so before it, and after it stopped, the state comes from the socket unit as systemd
says it (``socket_checked``): listening is "ready" (starts on the first request), failed or
inactive is "failed" (nothing holds the port), no answer is "unknown". "serving" only while
the process's reports say so and are fresh (``STALE_S``): unknown is never serving.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, Literal

from nodeagent.mirror.state import MirrorReport
from nodeagent.status import MirrorStatus

MAX_RECENT_MISSING: Final = 16
STALE_S: Final = 45.0
"""A report older than this (three of the process's report intervals) no longer says it
serves: the process was stopped or killed without its last report."""
SOCKET_RECHECK_S: Final = 600.0
"""While no fresh report says it serves, how often the socket unit is asked again."""

MirrorState = Literal["serving", "ready", "failed", "unknown"]


def socket_state(active: str, sub: str) -> MirrorState:
    """The node mirror's state from its socket unit's ``ActiveState`` and ``SubState``
    (no fresh report): held and waiting is "ready", not held is "failed"."""
    if active == "active" and sub in ("listening", "running"):
        return "ready"
    if active in ("failed", "inactive", "deactivating"):
        return "failed"
    return "unknown"  # activating, reloading, anything new: not guessed


class MirrorBoard:
    """The node mirror's status, from the reports (pure: the time is passed in)."""

    def __init__(self, listen: str) -> None:
        self.listen = listen
        self._last: MirrorReport | None = None
        self._reported_at = ""
        self._reported_mono: float | None = None
        self._socket: MirrorState | None = None
        self._socket_mono: float | None = None
        self._missing: OrderedDict[str, None] = OrderedDict()

    def reported(self, report: MirrorReport, at: str, now: float = 0.0) -> bool:
        """Take a state report (``now``: a monotonic clock); whether the status changed."""
        is_changed = report != self._last
        self._last, self._reported_at, self._reported_mono = report, at, now
        return is_changed

    def socket_checked(self, state: MirrorState, now: float) -> None:
        """What the socket unit's state says (``socket_state``; "unknown" when systemd
        could not be asked)."""
        self._socket, self._socket_mono = state, now

    def is_serving(self, now: float) -> bool:
        """A report that says it serves, fresh."""
        last, at = self._last, self._reported_mono
        return last is not None and last.serving and at is not None and now - at < STALE_S

    def wants_socket_check(self, now: float) -> bool:
        """Whether to ask systemd about the socket now: never asked yet, or no fresh report
        says it serves and the answer is older than the last report or ``SOCKET_RECHECK_S``."""
        if self.is_serving(now):
            return False
        asked = self._socket_mono
        if asked is None:
            return True
        reported = self._reported_mono
        return (reported is not None and reported >= asked) or now - asked >= SOCKET_RECHECK_S

    def state(self, now: float) -> MirrorState:
        if self.is_serving(now):
            return "serving"
        return self._socket or "unknown"

    def missing(self, digest: str) -> bool:
        self._missing.pop(digest, None)
        self._missing[digest] = None
        while len(self._missing) > MAX_RECENT_MISSING:
            self._missing.popitem(last=False)
        return True

    def status(self, now: float = 0.0) -> MirrorStatus | None:
        """The status (None until a report or a socket check said anything); the counts are
        the process's last report (zero before its first: no process, no request)."""
        last = self._last
        if last is None and self._socket is None:
            return None
        if last is None:
            last = MirrorReport(False, 0, 0, 0, 0, 0, 0)
        state = self.state(now)
        return MirrorStatus(
            serving=state == "serving",
            state=state,
            listen=self.listen,
            blobs=last.blobs,
            registry_blobs=last.registry_blobs,
            requests=last.requests,
            bytes_served=last.bytes_served,
            missing=last.missing,
            denied=last.denied,
            recent_missing=tuple(reversed(self._missing)),
            reported_at=self._reported_at,
        )
