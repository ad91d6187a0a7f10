"""``transfer.reap``: the tasks a fetch leaves are cancelled and waited for; a defect in one
reaches the journal (it was swallowed with every other BaseException before, the fetch's
own cancellation included)."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from nodeagent.errors import PeerUnreachable
from nodeagent.site.transfer import reap


async def _fails(error: BaseException, started: asyncio.Event) -> None:
    started.set()
    raise error


async def _waits(started: asyncio.Event) -> None:
    started.set()
    await asyncio.Event().wait()


async def test_a_task_that_failed_with_a_defect_is_said_and_the_others_are_cancelled() -> None:
    started = [asyncio.Event() for _ in range(3)]
    tasks = [
        asyncio.create_task(_fails(RuntimeError("a defect"), started[0])),
        asyncio.create_task(_fails(PeerUnreachable("peer x failed"), started[1])),
        asyncio.create_task(_waits(started[2])),
    ]
    for event in started:
        await event.wait()
    with capture_logs() as logs:
        await reap(tasks, "site-1")
    assert [(e["event"], e["reason"], e["bundle"]) for e in logs] == [
        ("fetch_task_failed", "InternalError", "site-1")
    ]
    assert "a defect" in logs[0]["error"]
    assert tasks[2].cancelled()


async def test_the_fetch_s_own_cancellation_goes_on_up() -> None:
    started = asyncio.Event()
    stubborn_done = asyncio.Event()

    async def stubborn() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await stubborn_done.wait()  # takes its time to end
            raise

    inner = asyncio.create_task(stubborn())
    await started.wait()
    reaper = asyncio.create_task(reap([inner], "site-1"))
    await asyncio.sleep(0)  # reap is now waiting for the inner task
    reaper.cancel()
    stubborn_done.set()
    with pytest.raises(asyncio.CancelledError):
        await reaper
