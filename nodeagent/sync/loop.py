"""When syncs run: the sync loop's timing, its backoffs, and where it reports.

Three clocks drive ``Reconciler.run``: a change (``request_sync``) syncs at once; a sync
that could not run at all (the runtime down) is retried after 1, 2, 4 … up to 60 s; a
sync that ran but left a set failing for a transient cause (the registry unreachable or
answering 5xx, a reset connection, the runtime restarting, a stalled pull, a size not
known yet) is run again after 5, 10, 20 … up to 60 s, forever, until the cause is gone.
Otherwise the next sync is the periodic re-check (10 minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from nodeagent.errors import NodeAgentError, TransientError, is_transient_reason
from nodeagent.status import NodeStatus

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SyncSchedule:
    """When syncs run besides on a change (the sync loop's timing)."""

    resync_interval_s: float = 600.0
    """Full re-check even without changes: CRI-O may have wiped its store after a crash."""
    retry_initial_s: float = 1.0
    retry_max_s: float = 60.0
    """Backoff of a sync that could not run (the runtime down): doubles up to this."""
    transient_retry_initial_s: float = 5.0
    transient_retry_max_s: float = 60.0
    """Backoff of a sync that left sets failing for a transient cause: the first retry comes
    within seconds, then doubling up to a minute, forever (not at the 10-minute resync)."""
    boot_grace_s: float = 60.0
    """At boot CRI-O starts after nodeagent (``Before=crio.service``): until the runtime first
    answered, an unreachable runtime in this window is expected and logged at info, not as the
    catalog's "runtime does not answer" warning a technician would chase."""


class SyncReport(Protocol):
    """Where the Reconciler reports its syncs (``reporting.Reporter``)."""

    def sync_started(self) -> None: ...

    def sync_progress(self, status: NodeStatus) -> None: ...

    def sync_finished(self, status: NodeStatus) -> None: ...

    def sync_failed(self, error: NodeAgentError) -> None: ...


Waiter = Callable[[asyncio.Event, float], Awaitable[None]]
"""Waits until the event is set or the seconds have passed (a virtual clock in tests)."""


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    """Until ``event`` is set or ``timeout_s`` passed. ``asyncio.timeout``, not ``wait_for``:
    Python 3.11's ``wait_for`` loses a cancellation that arrives as the event is set, and
    the loop around it then outlives the daemon's stop (found by a CI run)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()


class Backoff:
    """Doubling delays from ``initial_s`` up to ``max_s``; ``reset`` starts over."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self._next_s = initial_s

    def next(self) -> float:
        delay_s = self._next_s
        self._next_s = min(self._next_s * 2, self.max_s)
        return delay_s

    def reset(self) -> None:
        self._next_s = self.initial_s


def transient_cause(status: NodeStatus) -> tuple[str, str, list[str]] | None:
    """(reason, message, sets) of the first failure a retry may cure, or None.

    Per image failures are what count: a set held because a size is unknown carries the
    manifest's failure (``RegistryUnavailable`` … or a permanent ``ImageNotFound``).
    """
    found: tuple[str, str] | None = None
    sets: list[str] = []
    for s in status.sets:
        cause = next((f for f in s.failures if is_transient_reason(f.reason)), None)
        if cause is None:
            continue
        sets.append(s.name)
        found = found or (cause.reason, f"{cause.ref}: {cause.message}")
    return None if found is None else (found[0], found[1], sets)


def log_postponed(exc: TransientError, delay_s: float, *, is_booting: bool) -> None:
    """A sync that must wait: a warning, except for the runtime not up yet at boot."""
    if is_booting and exc.reason == "RuntimeUnreachable":
        log.info("runtime_awaited", reason=exc.reason, retry_in_s=round(delay_s))
        return
    log.warning("sync_postponed", reason=exc.reason, error=exc.message, retry_in_s=round(delay_s))
