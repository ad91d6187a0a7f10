"""Every task the daemon starts runs guarded: critical ones stop it, optional ones restart.

* A **critical** task (the sync loop, the spec watch, the watchdog) that fails ends the
  daemon: every other task is cancelled and ``Supervisor.run`` returns the exit code of
  the failure (``exit_code_for``), so systemd's ``Restart=`` policy and the journal see
  why. A critical task that returns is a failure too: the daemon cannot pin without it.
* An **optional** task (the udev media watcher, the cluster tasks) that fails is logged
  with its reason and restarted after a backoff that doubles up to ``backoff_max_s``
  (reset after it ran for that long without failing); it never stops pinning.
* A **one-off** task (a bundle import, a media event) is started with ``spawn``; its
  failure is logged with its reason and handed to the caller's ``on_error`` (which turns
  it into a status entry), never left as asyncio's "Task exception was never retrieved".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from nodeagent.errors import NodeAgentError

log = structlog.get_logger(__name__)

EXIT_TASK_FAILED = 70
"""A critical task failed with an unexpected error (sysexits' EX_SOFTWARE): a bug to report."""
EXIT_TASK_ENDED = 70
"""A critical task returned although it never should (also a bug)."""


def exit_code_for(error: BaseException) -> int:
    """The process exit code for a critical task's failure (docs/operations.md, exit codes).

    A nodeagent error carries its own (``errors.NodeAgentError.exit_code``); an
    ``ExceptionGroup`` takes the code of its first leaf; anything else is a bug.
    """
    if isinstance(error, BaseExceptionGroup):
        return exit_code_for(error.exceptions[0])
    if isinstance(error, NodeAgentError):
        return error.exit_code
    return EXIT_TASK_FAILED


def describe(error: BaseException) -> tuple[str, str]:
    """(reason, message) of a failure, for the journal and the status."""
    if isinstance(error, BaseExceptionGroup):
        return describe(error.exceptions[0])
    if isinstance(error, NodeAgentError):
        return error.reason, error.message
    return "InternalError", f"{type(error).__name__}: {error}"


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    work: Callable[[], Awaitable[None]]
    is_critical: bool


class CriticalTaskEnded(Exception):
    """A critical task returned or failed: the daemon stops (carries the exit code)."""

    def __init__(self, name: str, exit_code: int) -> None:
        super().__init__(name)
        self.name = name
        self.exit_code = exit_code


class Supervisor:
    def __init__(
        self,
        *,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 300.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._sleep = sleep
        self._monotonic = monotonic
        self._spawned: set[asyncio.Task[None]] = set()
        self.restarts: dict[str, int] = {}
        """Per optional task, how often it was restarted (for tests and the status)."""

    async def run(self, tasks: Sequence[Task], stop: asyncio.Event) -> int:
        """Run until ``stop`` is set (exit 0) or a critical task ends (its exit code)."""
        ended: list[CriticalTaskEnded] = []
        try:
            async with asyncio.TaskGroup() as group:
                running = [group.create_task(self._guarded(task), name=task.name) for task in tasks]
                await stop.wait()
                log.info("daemon_stopping")
                for task in running:
                    task.cancel()
        except* CriticalTaskEnded as group_error:
            ended.extend(e for e in group_error.exceptions if isinstance(e, CriticalTaskEnded))
        finally:
            await self.cancel_spawned()
        return ended[0].exit_code if ended else 0

    async def _guarded(self, task: Task) -> None:
        if task.is_critical:
            await self._critical(task)
        else:
            await self._restarting(task)

    async def _critical(self, task: Task) -> None:
        try:
            await task.work()
        except asyncio.CancelledError:
            log.debug("task_cancelled", task=task.name)
            raise
        except Exception as exc:
            reason, message = describe(exc)
            log.critical(
                "critical_task_failed",
                task=task.name,
                reason=reason,
                error=message,
                exc_info=not isinstance(exc, NodeAgentError),
            )
            raise CriticalTaskEnded(task.name, exit_code_for(exc)) from exc
        log.critical("critical_task_ended", task=task.name, reason="InternalError")
        raise CriticalTaskEnded(task.name, EXIT_TASK_ENDED)

    async def _restarting(self, task: Task) -> None:
        delay_s = self.backoff_initial_s
        while True:
            started = self._monotonic()
            try:
                await task.work()
            except asyncio.CancelledError:
                log.debug("task_cancelled", task=task.name)
                raise
            except Exception as exc:
                if self._monotonic() - started >= self.backoff_max_s:
                    delay_s = self.backoff_initial_s
                reason, message = describe(exc)
                log.error(
                    "optional_task_failed",
                    task=task.name,
                    reason=reason,
                    error=message,
                    restart_in_s=round(delay_s, 1),
                    exc_info=not isinstance(exc, NodeAgentError),
                )
                self.restarts[task.name] = self.restarts.get(task.name, 0) + 1
                await self._sleep(delay_s)
                delay_s = min(delay_s * 2, self.backoff_max_s)
                log.info("optional_task_restarted", task=task.name)
                continue
            log.debug("task_exited", task=task.name)
            return

    # ---------------------------------------------------------------- one-off tasks
    def spawn(
        self,
        name: str,
        work: Coroutine[Any, Any, None],
        *,
        on_error: Callable[[str, str], None] = lambda _reason, _message: None,
    ) -> asyncio.Task[None]:
        """Start a one-off task; a failure is logged and given to ``on_error(reason, message)``."""

        async def guarded() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                reason, message = describe(exc)
                log.error(
                    "task_failed",
                    task=name,
                    reason=reason,
                    error=message,
                    exc_info=not isinstance(exc, NodeAgentError),
                )
                on_error(reason, message)

        task = asyncio.create_task(guarded(), name=name)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)
        return task

    async def cancel_spawned(self) -> None:
        for task in list(self._spawned):
            task.cancel()
        if self._spawned:
            await asyncio.gather(*self._spawned, return_exceptions=True)
