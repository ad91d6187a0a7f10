"""Virtual time and an inline executor for unit tests of code that sleeps or blocks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class VirtualClock:
    """``monotonic`` and ``sleep`` for code under test: sleeping advances time at once.

    Every sleep adds its delay to the clock and yields to the event loop once,
    so concurrent sleepers add up rather than overlap; tests assert on the
    delays asked for (``sleeps``) and on times observed by one party.
    """

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now_s

    async def sleep(self, delay_s: float) -> None:
        self.sleeps.append(delay_s)
        self.now_s += max(delay_s, 0.0)
        await asyncio.sleep(0)

    async def until(self, deadline_s: float, *, max_yields: int = 100_000) -> None:
        """Yield until someone else has moved the clock to ``deadline_s`` (bounded)."""
        for _ in range(max_yields):
            if self.now_s >= deadline_s:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"virtual time stuck at {self.now_s}, waited for {deadline_s}")


async def run_inline(call: Callable[[], int]) -> int:
    """``PrePuller(run_blocking=...)`` without a thread: the probe runs on the loop."""
    return call()
