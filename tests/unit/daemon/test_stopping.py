"""A stop that takes long names, in the journal, the tasks and worker threads it waits for."""

from __future__ import annotations

import asyncio
import threading

from structlog.testing import capture_logs

from nodeagent.adapters.store.registry_sets import ChunkPipe
from nodeagent.daemon.stopping import report_when_stopping, still_running
from nodeagent.daemon.supervisor import Supervisor, Task
from nodeagent.sync.loop import wait_event


async def test_still_running_names_a_waiting_task_and_a_thread_inside_nodeagent() -> None:
    never = asyncio.Event()
    waiting = asyncio.create_task(never.wait(), name="sync")
    pipe = ChunkPipe()
    reader = threading.Thread(
        target=lambda: pipe.readinto(memoryview(bytearray(16))), name="blob-fill"
    )
    reader.start()
    try:
        await asyncio.sleep(0)  # the task reaches its wait
        items = still_running(asyncio.current_task())
        assert any(item.startswith("task sync (") for item in items), items
        fill = [item for item in items if item.startswith("thread blob-fill")]
        assert fill, items
        assert "nodeagent/adapters/store/registry_sets.py:" in fill[0]
        assert fill[0].endswith("in readinto)")
    finally:
        pipe.end()
        reader.join(timeout=5)
        waiting.cancel()
    assert not any("blob-fill" in item for item in still_running(asyncio.current_task()))


async def test_a_task_is_named_by_the_innermost_coroutine_of_nodeagent_it_waits_in() -> None:
    never = asyncio.Event()

    async def drill() -> None:
        await never.wait()

    work = Task("drill", drill, is_critical=False)
    guarded = asyncio.create_task(Supervisor()._guarded(work), name="drill")
    await asyncio.sleep(0)
    try:
        (item,) = [i for i in still_running(asyncio.current_task()) if i.startswith("task drill")]
        # _guarded awaits _restarting, which awaits the work (this test's, not nodeagent's)
        assert "nodeagent/daemon/supervisor.py:" in item
        assert item.endswith("in _restarting)"), item
    finally:
        guarded.cancel()
        await asyncio.gather(guarded, return_exceptions=True)


async def test_nothing_is_reported_before_the_stop_and_each_period_after_it() -> None:
    stop = asyncio.Event()
    with capture_logs() as logs:
        reporter = asyncio.create_task(report_when_stopping(stop, every_s=0.01))
        await asyncio.sleep(0.05)
        assert not logs  # running normally: silent
        stop.set()
        for _ in range(200):
            if len(logs) >= 2:
                break
            await asyncio.sleep(0.01)
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)
    assert len(logs) >= 2
    assert all(entry["event"] == "daemon_stopping_slowly" for entry in logs)
    assert all(entry["log_level"] == "warning" for entry in logs)


async def test_a_loop_woken_as_it_is_cancelled_still_stops() -> None:
    """Python 3.11's ``asyncio.wait_for`` returns the result when the awaited thing completes
    in the same turn as the cancellation, and the cancellation is lost: a loop around it
    (the offline drill's, the cluster reporter's) went on after SIGTERM and held the stop
    until systemd's kill. The daemon's loops wait with ``asyncio.timeout`` (``wait_event``);
    ruff's TID251 bans ``wait_for`` in nodeagent."""
    woken = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            await wait_event(woken, 30.0)
            woken.clear()
            rounds += 1

    for _ in range(20):  # the wake and the cancel in the same turn of the event loop
        task = asyncio.create_task(loop())
        await asyncio.sleep(0)
        woken.set()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        assert done, "the loop did not stop: its cancellation was lost"
        assert task.cancelled()
