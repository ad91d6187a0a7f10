"""Waiting on conditions with a deadline: the only way the test environment waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not become true before its deadline."""


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout_s: float,
    interval_s: float = 0.05,
    what: str,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` until it returns a truthy value; return that value.

    On timeout, raise ``WaitTimeout`` naming ``what`` and, if given, the text
    ``detail()`` returns (typically the tail of a daemon's log).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise WaitTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}{extra}")
        time.sleep(interval_s)


def log_tail(path: Path, *, max_bytes: int = 6000) -> str:
    """The last ``max_bytes`` of a log file, for failure messages."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return f"(no log at {path})"
    return f"--- last lines of {path} ---\n" + data[-max_bytes:].decode(errors="replace")


async def wait_for_async(
    condition: Callable[[], Awaitable[T | None]],
    *,
    timeout_s: float,
    interval_s: float = 0.1,
    what: str,
) -> T:
    """``wait_for`` for a coroutine condition (a CRI call, say), without blocking the loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval_s)
