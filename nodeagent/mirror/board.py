"""What the daemon knows of the node mirror: the peer process's last report and the digests
asked for that the store lacks (the most recent ``MAX_RECENT_MISSING``)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from nodeagent.mirror.state import MirrorReport
from nodeagent.status import MirrorStatus

MAX_RECENT_MISSING: Final = 16


class MirrorBoard:
    """The node mirror's status, from the reports (pure: the time is passed in)."""

    def __init__(self, listen: str) -> None:
        self.listen = listen
        self._last: MirrorReport | None = None
        self._reported_at = ""
        self._missing: OrderedDict[str, None] = OrderedDict()

    def reported(self, report: MirrorReport, at: str) -> bool:
        """Take a state report; whether the status changed."""
        is_changed = report != self._last
        self._last, self._reported_at = report, at
        return is_changed

    def missing(self, digest: str) -> bool:
        self._missing.pop(digest, None)
        self._missing[digest] = None
        while len(self._missing) > MAX_RECENT_MISSING:
            self._missing.popitem(last=False)
        return True

    def status(self) -> MirrorStatus | None:
        last = self._last
        if last is None:
            return None
        return MirrorStatus(
            serving=last.serving,
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
