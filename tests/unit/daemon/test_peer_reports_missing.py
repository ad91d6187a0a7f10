"""A digest the node mirror lacked reaches the fetcher (decision 0061): ``PeerReports``
hands each ``missing`` report to ``on_missing``, and nothing else does."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nodeagent.daemon.peer_reports import PeerReports

DIGEST = "sha256:" + "ab" * 32


class Datagrams:
    """A ``ReportSocket`` that delivers ``data`` and then waits for ever."""

    def __init__(self, data: list[bytes]) -> None:
        self.path = Path("/nonexistent/reports.sock")
        self._data = list(data)

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def receive(self) -> bytes:
        if self._data:
            return self._data.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def received(data: list[bytes]) -> list[str]:
    told: list[str] = []
    done = asyncio.Event()

    def on_missing(digest: str) -> None:
        told.append(digest)
        done.set()

    reports = PeerReports(
        Datagrams(data),  # type: ignore[arg-type]
        Path("/nonexistent"),
        lambda _root, _digest: False,
        on_missing=on_missing,
    )
    task = asyncio.create_task(reports.run())
    try:
        async with asyncio.timeout(0.5):
            await done.wait()
    except TimeoutError:
        pass
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return told


async def test_a_missing_digest_is_handed_to_the_fetcher() -> None:
    assert await received([b"served 10", f"missing {DIGEST}".encode()]) == [DIGEST]


async def test_other_reports_and_malformed_ones_wake_nothing() -> None:
    data = [b"served 10", b"mirror on 0 0 1 0 1 0", b"missing sha256:XYZ", b"missing " + b"a" * 64]
    assert await received(data) == []
