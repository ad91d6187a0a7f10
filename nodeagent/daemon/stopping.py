"""A stop that takes long says what it still waits for.

After SIGTERM every task is cancelled; a step that cannot be interrupted (a worker thread
writing a blob, a CRI call) finishes first. systemd kills the daemon after the unit's
``TimeoutStopSec=``; before that, every ``SLOW_STOP_S`` seconds, the journal names what is
left, so that a slow stop can be told from a hung one and traced to the step holding it:

    daemon_stopping_slowly: seconds=10 waiting_for="task sync (nodeagent/sync/...:120
    in _pull); thread asyncio_0 (nodeagent/adapters/registry/http.py:88 in exchange)"
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Final

import structlog

log = structlog.get_logger(__name__)

SLOW_STOP_S: Final = 10.0
"""Seconds between two reports of a stop still in progress."""

_PACKAGE_DIR: Final = Path(__file__).resolve().parent.parent
_MAX_ITEMS: Final = 12
_OUTSIDE: Final = "outside nodeagent's code"
_MAX_DEPTH: Final = 64


def _where(frame: FrameType | None) -> str:
    """The innermost of ``frame``'s callers that is nodeagent's code, as ``path:line in f``."""
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(_PACKAGE_DIR):
            relative = path.relative_to(_PACKAGE_DIR.parent)
            return f"{relative}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return _OUTSIDE


def _awaited(task: asyncio.Task[object]) -> list[FrameType]:
    """The frames of the chain of coroutines ``task`` waits in, outermost first
    (``Task.get_stack`` gives the outermost alone)."""
    frames: list[FrameType] = []
    awaited: object = task.get_coro()
    while awaited is not None and len(frames) < _MAX_DEPTH:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if not isinstance(frame, FrameType):
            break
        frames.append(frame)
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return frames


def still_running(current: asyncio.Task[object] | None = None) -> list[str]:
    """The tasks (but ``current``) and worker threads still alive, each with where it waits."""
    items: list[str] = []
    for task in asyncio.all_tasks():
        if task is current or task.done():
            continue
        where = next((w for w in map(_where, reversed(_awaited(task))) if w != _OUTSIDE), _OUTSIDE)
        items.append(f"task {task.get_name()} ({where})")
    frames = sys._current_frames()
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.ident is None:
            continue
        where = _where(frames.get(thread.ident))
        if where != _OUTSIDE:  # else an idle pool worker, or a library's own thread
            items.append(f"thread {thread.name} ({where})")
    if len(items) > _MAX_ITEMS:
        items[_MAX_ITEMS:] = [f"{len(items) - _MAX_ITEMS} more"]
    return items


async def report_when_stopping(stop: asyncio.Event, every_s: float = SLOW_STOP_S) -> None:
    """Once ``stop`` is set, report what is left every ``every_s`` seconds (until cancelled)."""
    await stop.wait()
    started = time.monotonic()
    me = asyncio.current_task()
    while True:
        await asyncio.sleep(every_s)
        waiting = still_running(me)
        log.warning(
            "daemon_stopping_slowly",
            seconds=round(time.monotonic() - started),
            waiting_for="; ".join(waiting) or "nothing nodeagent started (the event loop)",
        )
