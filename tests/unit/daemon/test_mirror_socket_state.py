"""The daemon's status says "ready" before the socket-activated mirror process ever ran,
from its socket unit, and "serving" once the process reports (decision 0063)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nodeagent.daemon.peer_reports import PeerReports
from nodeagent.mirror.board import MirrorState
from nodeagent.mirror.state import MirrorReport
from nodeagent.site.reports import render_mirror
from nodeagent.status import MirrorStatus
from tests.unit.daemon.test_peer_reports_missing import Datagrams


async def states(data: list[bytes], socket: MirrorState, wanted: int) -> list[tuple[str, bool]]:
    seen: list[tuple[str, bool]] = []
    asked: list[None] = []
    done = asyncio.Event()

    def on_mirror(status: MirrorStatus) -> None:
        seen.append((status.state, status.serving))
        if len(seen) >= wanted:
            done.set()

    async def ask() -> MirrorState:
        asked.append(None)
        return socket

    reports = PeerReports(
        Datagrams(data),  # type: ignore[arg-type]
        Path("/nonexistent"),
        lambda _root, _digest: False,
        mirror_listen="127.0.0.1:22626",
        on_mirror=on_mirror,
        socket_state=ask,
    )
    task = asyncio.create_task(reports.run())
    try:
        async with asyncio.timeout(2):
            await done.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return seen


async def test_ready_from_the_socket_before_any_report() -> None:
    """The socket unit is asked at start (here: says "ready"); no report, no process."""
    assert await states([], "ready", 1) == [("ready", False)]


async def test_a_failed_socket_is_said() -> None:
    assert await states([], "failed", 1) == [("failed", False)]


async def test_the_first_report_makes_it_serving() -> None:
    serving = render_mirror(MirrorReport(True, 1, 0, 1, 10, 0, 0))
    seen = await states([serving], "ready", 2)
    assert seen[-1] == ("serving", True)  # a fresh report: no need to ask systemd
