"""The daemon's Supervisor: critical tasks end the daemon with a code, optional ones restart.

Backoff runs on a virtual clock (``VirtualClock.sleep`` records each delay). asyncio's
exception handler is replaced by a recorder, so a failure nobody retrieved fails the test.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from nodeagent.daemon.supervisor import (
    EXIT_TASK_ENDED,
    EXIT_TASK_FAILED,
    Supervisor,
    Task,
    describe,
    exit_code_for,
)
from nodeagent.errors import (
    ConfigInvalid,
    HostFileError,
    InsufficientDiskSpace,
    MediaWatchFailed,
    NodeAgentError,
    RuntimeUnreachable,
)
from tests.fakes.clock import VirtualClock
from tests.fakes.ports import until


@pytest.fixture(autouse=True)
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        yield errors
        gc.collect()
        assert errors == []
    finally:
        loop.set_exception_handler(previous)


class Parked:
    """A task body that runs until cancelled, and remembers that it was."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def __call__(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class Failing:
    """A task body that raises the given errors, one per run, then parks.

    ``ran_s`` (with ``clock``): per run, the virtual seconds it ran before it failed.
    """

    def __init__(
        self, *errors: Exception, clock: VirtualClock | None = None, ran_s: tuple[float, ...] = ()
    ) -> None:
        self.errors = list(errors)
        self.runs = 0
        self.clock = clock
        self.ran_s = list(ran_s)
        self.parked = Parked()

    async def __call__(self) -> None:
        self.runs += 1
        if not self.errors:
            await self.parked()
        if self.clock is not None and self.ran_s:
            self.clock.now_s += self.ran_s.pop(0)
        raise self.errors.pop(0)


def raising(error: BaseException) -> Callable[[], Coroutine[Any, Any, None]]:
    async def work() -> None:
        await asyncio.sleep(0)
        raise error

    return work


async def returning() -> None:
    await asyncio.sleep(0)


def supervisor(clock: VirtualClock, *, backoff_max_s: float = 300.0) -> Supervisor:
    return Supervisor(
        backoff_initial_s=1.0,
        backoff_max_s=backoff_max_s,
        sleep=clock.sleep,
        monotonic=clock.monotonic,
    )


async def run_with(sup: Supervisor, *tasks: Task) -> int:
    return await asyncio.wait_for(sup.run(tasks, asyncio.Event()), 5)


# ---------------------------------------------------------------- optional tasks
async def test_failing_optional_task_restarts_with_doubling_backoff_and_never_stops_pinning() -> (
    None
):
    clock = VirtualClock()
    sup = supervisor(clock)
    watch = Failing(
        MediaWatchFailed("udev socket overflow"),
        ValueError("a bug in the watcher"),
        MediaWatchFailed("udev socket overflow"),
        MediaWatchFailed("udev socket overflow"),
    )
    sync = Parked()
    stop = asyncio.Event()
    running = asyncio.create_task(
        sup.run([Task("sync", sync, is_critical=True), Task("media", watch, False)], stop)
    )

    await until(watch.parked.started.is_set)

    assert watch.runs == 5
    assert clock.sleeps == [1.0, 2.0, 4.0, 8.0]
    assert sup.restarts == {"media": 4}
    assert (sync.started.is_set(), sync.cancelled, running.done()) == (True, False, False)
    stop.set()
    assert await asyncio.wait_for(running, 5) == 0
    assert sync.cancelled
    assert watch.parked.cancelled


async def test_optional_backoff_is_capped_and_resets_after_a_long_healthy_run() -> None:
    clock = VirtualClock()
    sup = supervisor(clock, backoff_max_s=8.0)
    error = MediaWatchFailed("udev socket overflow")
    watch = Failing(*[error] * 5)
    stop = asyncio.Event()
    running = asyncio.create_task(sup.run([Task("media", watch, False)], stop))

    await until(watch.parked.started.is_set)
    assert clock.sleeps == [1.0, 2.0, 4.0, 8.0, 8.0]

    stop.set()
    assert await asyncio.wait_for(running, 5) == 0

    clock.sleeps.clear()
    # the second restart runs for backoff_max_s before it fails: healthy enough to start over
    healthy = Failing(error, error, error, clock=clock, ran_s=(0.0, 0.0, 8.0))
    stop = asyncio.Event()
    running = asyncio.create_task(sup.run([Task("media", healthy, False)], stop))
    await until(healthy.parked.started.is_set)
    stop.set()
    assert await asyncio.wait_for(running, 5) == 0
    assert clock.sleeps == [1.0, 2.0, 1.0]


async def test_optional_task_that_returns_is_not_restarted() -> None:
    clock = VirtualClock()
    sup = supervisor(clock)
    runs: list[int] = []

    async def once() -> None:
        await asyncio.sleep(0)
        runs.append(1)

    sync = Parked()
    stop = asyncio.Event()
    running = asyncio.create_task(
        sup.run([Task("cluster", once, False), Task("sync", sync, True)], stop)
    )
    await until(lambda: sync.started.is_set() and bool(runs))

    assert (runs, sup.restarts, clock.sleeps) == ([1], {}, [])
    assert not running.done()
    stop.set()
    assert await asyncio.wait_for(running, 5) == 0


# ---------------------------------------------------------------- critical tasks
@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigInvalid("[runtime] endpoint must be a unix socket path"), 78),
        (RuntimeUnreachable("cannot connect"), 69),
        (InsufficientDiskSpace("state directory full"), 73),
        (HostFileError("cannot write /var/lib/nodeagent/ledger.json"), 74),
    ],
)
async def test_critical_task_failing_with_a_nodeagent_error_ends_run_with_its_exit_code(
    error: NodeAgentError, code: int
) -> None:
    sup = supervisor(VirtualClock())
    other = Parked()
    optional = Parked()
    spawned = Parked()

    async def sync() -> None:
        await other.started.wait()
        await optional.started.wait()
        sup.spawn("import /dev/sdb1", spawned())
        await spawned.started.wait()
        raise error

    assert error.exit_code == code
    result = await run_with(
        sup,
        Task("sync", sync, True),
        Task("watchdog", other, True),
        Task("media", optional, False),
    )

    assert result == code
    assert (other.cancelled, optional.cancelled, spawned.cancelled) == (True, True, True)


async def test_critical_task_failing_unexpectedly_ends_run_with_70() -> None:
    sup = supervisor(VirtualClock())
    assert await run_with(sup, Task("sync", raising(KeyError("generation")), True)) == 70
    assert EXIT_TASK_FAILED == 70


async def test_critical_task_that_returns_ends_run_with_70() -> None:
    sup = supervisor(VirtualClock())
    other = Parked()
    assert await run_with(sup, Task("spec-watch", returning, True), Task("sync", other, True)) == 70
    assert EXIT_TASK_ENDED == 70
    assert other.cancelled


async def test_critical_task_raising_an_exception_group_ends_with_its_first_leafs_code() -> None:
    sup = supervisor(VirtualClock())

    async def fan_out() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(raising(ConfigInvalid("bad [disk] section"))())

    assert await run_with(sup, Task("cluster", fan_out, True)) == 78


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (ExceptionGroup("g", [ConfigInvalid("a"), RuntimeUnreachable("b")]), 78, "ConfigInvalid"),
        (
            ExceptionGroup("g", [ExceptionGroup("h", [HostFileError("c")]), ConfigInvalid("a")]),
            74,
            "HostFileError",
        ),
        (ExceptionGroup("g", [ValueError("d"), ConfigInvalid("a")]), 70, "InternalError"),
        (RuntimeUnreachable("b"), 69, "RuntimeUnreachable"),
        (OSError("e"), 70, "InternalError"),
    ],
)
def test_exit_code_and_reason_of_a_failure_are_its_first_leafs(
    error: BaseException, code: int, reason: str
) -> None:
    assert exit_code_for(error) == code
    assert describe(error)[0] == reason


def test_describe_names_the_type_of_an_unexpected_error() -> None:
    assert describe(ValueError("boom")) == ("InternalError", "ValueError: boom")
    assert describe(ConfigInvalid("bad")) == ("ConfigInvalid", "bad")


# ---------------------------------------------------------------- stop and one-off tasks
async def test_stop_ends_run_with_0_and_cancels_spawned_tasks() -> None:
    sup = supervisor(VirtualClock())
    sync = Parked()
    spawned = Parked()
    errors: list[tuple[str, str]] = []
    stop = asyncio.Event()
    running = asyncio.create_task(sup.run([Task("sync", sync, True)], stop))
    await until(sync.started.is_set)
    task = sup.spawn("import /dev/sdb1", spawned(), on_error=lambda r, m: errors.append((r, m)))
    await until(spawned.started.is_set)

    stop.set()

    assert await asyncio.wait_for(running, 5) == 0
    assert task.cancelled()
    assert (sync.cancelled, spawned.cancelled) == (True, True)
    assert errors == []


@pytest.mark.parametrize(
    ("error", "reported"),
    [
        (
            RuntimeUnreachable("cannot connect to /run/crio/crio.sock"),
            ("RuntimeUnreachable", "cannot connect to /run/crio/crio.sock"),
        ),
        (
            ZeroDivisionError("division by zero"),
            ("InternalError", "ZeroDivisionError: division by zero"),
        ),
    ],
)
async def test_spawned_task_failure_goes_to_on_error_and_is_retrieved(
    error: Exception, reported: tuple[str, str], loop_errors: list[dict[str, Any]]
) -> None:
    sup = supervisor(VirtualClock())
    errors: list[tuple[str, str]] = []

    task = sup.spawn(
        "import /dev/sdb1", raising(error)(), on_error=lambda r, m: errors.append((r, m))
    )
    await asyncio.wait_for(task, 5)
    del task
    gc.collect()

    assert errors == [reported]
    assert loop_errors == []


async def test_spawned_task_that_succeeds_or_is_cancelled_reports_nothing() -> None:
    sup = supervisor(VirtualClock())
    errors: list[tuple[str, str]] = []
    fine = sup.spawn("a", returning(), on_error=lambda r, m: errors.append((r, m)))
    parked = Parked()
    stuck = sup.spawn("b", parked(), on_error=lambda r, m: errors.append((r, m)))
    await until(parked.started.is_set)

    await sup.cancel_spawned()

    assert fine.done() and not fine.cancelled()
    assert stuck.cancelled()
    assert errors == []
