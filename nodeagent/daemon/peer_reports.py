"""The daemon's side of the peer server's reports (``[site] serve``; decision 0056).

The peer server runs in its own process (``nodeagent serve-peers``, the unit
``nodeagent-peer.service``), which can read the store but not change it. It reports a blob
that failed its digest while it was served, and the bytes it served, on a unix socket the
daemon binds (``nodeagent.adapters.peer_reports``). The daemon trusts no report: each
reported blob is hashed again by the daemon (``keeper.set_aside_corrupt``, under the store's
lock) and removed only when it really is damaged (counted as ``StoreBlobCorrupt``, as
before); how many are hashed, and how often, is bounded by ``nodeagent.site.reports``.

The node mirror, served by the same process (decision 0057), reports its state there too:
the daemon keeps it for the status (``MirrorBoard``) and counts its bytes (``mirrored``).

An optional task: without it the peer process's reports wait in its own queue (it sends them
again), and a damaged blob is still never sent whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import structlog

from nodeagent.adapters.peer_reports import ReportSocket
from nodeagent.config import Config
from nodeagent.errors import StoreBlobCorrupt
from nodeagent.metrics import NO_METRICS, Metrics
from nodeagent.metrics.series import Transfer
from nodeagent.mirror.board import MirrorBoard, MirrorState
from nodeagent.site.reports import (
    CorruptReport,
    MirrorReport,
    MissingReport,
    Refusal,
    ReportGate,
    ServedReport,
    parse_report,
)
from nodeagent.status import MirrorStatus

log = structlog.get_logger(__name__)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


SOCKET_TICK_S: Final = 15.0
"""How often the node mirror's state is looked at (a child is run only when it is asked)."""
REPORT_SOCKET: Final = Path("peer") / "reports.sock"
"""The socket, under ``[state] run_dir`` (``/run/nodeagent/peer/reports.sock``)."""


def report_socket_path(config: Config) -> Path:
    return config.state.run_dir / REPORT_SOCKET


SetAside = Callable[[Path, str], bool]
"""``keeper.set_aside_corrupt``: hash the blob under the store's lock; True when removed."""


class PeerReports:
    """Receives the peer process's reports until cancelled; checks what they claim."""

    def __init__(
        self,
        socket: ReportSocket,
        store_root: Path,
        set_aside: SetAside,
        metrics: Metrics = NO_METRICS,
        clock: Callable[[], float] = time.monotonic,
        *,
        mirror_listen: str = "",
        on_mirror: Callable[[MirrorStatus], None] | None = None,
        on_missing: Callable[[str], None] | None = None,
        socket_state: Callable[[], Awaitable[MirrorState]] | None = None,
    ) -> None:
        self._socket, self._store_root, self._set_aside = socket, store_root, set_aside
        self._metrics, self._clock = metrics, clock
        self.board = MirrorBoard(mirror_listen)
        """The node mirror's last state and the digests it lacked (decision 0057)."""
        self._on_mirror = on_mirror
        self._on_missing = on_missing
        """Told each digest the node mirror lacked (the fetcher looks at its peers now)."""
        self._socket_state = socket_state
        """Asks systemd for the node mirror's socket unit (decision 0063); None: not asked."""
        self._mirror_bytes = 0
        self.gate = ReportGate(clock())
        self._waiting = asyncio.Event()
        self.removed: list[str] = []
        """Digests removed because a report was confirmed, in order."""
        self.sound: list[str] = []
        """Digests reported that the daemon found sound (or gone), in order."""

    async def run(self) -> None:
        await asyncio.to_thread(self._socket.open)
        log.info("peer_reports_listening", socket=str(self._socket.path))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._receive())
                group.create_task(self._check())
                if self._socket_state is not None:
                    group.create_task(self._watch_socket(self._socket_state))
        finally:
            self._socket.close()

    async def _receive(self) -> None:
        while True:
            data = await self._socket.receive()
            report = parse_report(data)
            if report is None:
                self._refused("malformed", size_bytes=len(data))
            elif isinstance(report, CorruptReport):
                refusal = self.gate.offer(report.digest, self._clock())
                if refusal is None:
                    self._waiting.set()
                elif refusal == "queue_full":
                    self._refused(refusal, digest=report.digest, counted=False)
            elif isinstance(report, ServedReport):
                self._metrics.transferred(Transfer.SERVED, report.size_bytes)
            else:
                self._mirror(report)

    def _mirror(self, report: MirrorReport | MissingReport) -> None:
        """The node mirror's state: status (the bytes to the metrics); a digest it lacked
        also wakes the fetcher (``on_missing``, decision 0061)."""
        if isinstance(report, MissingReport):
            self.board.missing(report.digest)
            if self._on_missing is not None:
                self._on_missing(report.digest)
        else:
            last = self._mirror_bytes
            self._mirror_bytes = report.bytes_served
            # counts restart with the peer process: a smaller count is all new
            added = (
                report.bytes_served - last if report.bytes_served >= last else report.bytes_served
            )
            if added:
                self._metrics.transferred(Transfer.MIRRORED, added)
            self.board.reported(report, utc_now(), self._clock())
        self._publish()

    def _publish(self) -> None:
        status = self.board.status(self._clock())
        if status is not None:
            self._metrics.mirror_reported(status)
            if self._on_mirror is not None:
                self._on_mirror(status)

    def _refused(self, reason: Refusal, *, counted: bool = True, **fields: object) -> None:
        """Said at warning the first time for each reason, then at debug (counted in the
        gate's ``refused``)."""
        if counted:
            self.gate.refuse(reason)
        first = self.gate.refused.get(reason, 0) <= 1
        emit = log.warning if first else log.debug
        emit("peer_report_refused", reason=reason, **fields)

    async def _watch_socket(self, ask: Callable[[], Awaitable[MirrorState]]) -> None:
        """The node mirror's state while no fresh report says it serves: its socket unit,
        asked at start, when the reports stop, and every ``SOCKET_RECHECK_S`` (a short-lived
        child each time: ``adapters.systemd.socket_unit_state``)."""
        said: MirrorState | None = None
        while True:
            if self.board.wants_socket_check(self._clock()):
                self.board.socket_checked(await ask(), self._clock())
            state = self.board.state(self._clock())
            if state != said:
                said = state
                log.info("node_mirror_state", state=state, listen=self.board.listen)
                self._publish()
            await asyncio.sleep(SOCKET_TICK_S)

    async def _check(self) -> None:
        while True:
            digest, wait_s = self.gate.next_check(self._clock())
            if digest is None:
                self._waiting.clear()
                timeout = None if wait_s == float("inf") else wait_s
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._waiting.wait()
                continue
            is_removed = await asyncio.to_thread(self._set_aside, self._store_root, digest)
            if is_removed:
                self.removed.append(digest)
                self._metrics.store_damaged(StoreBlobCorrupt.reason)
                log.info("peer_report_confirmed", digest=digest)
            else:
                self.sound.append(digest)
                log.warning("peer_report_not_confirmed", digest=digest)
