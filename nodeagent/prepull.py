"""Pre-pull: get every missing image into the runtime, in parallel, patiently.

Policy, in contrast with the machine-config-daemon's whole-sync deadline: each
image has its own attempts with exponential backoff and jitter; a pull only
fails for slowness when nothing it fetched has been written for
``stall_timeout_s``. There is no progress API in CRI: the signal is the files
pulls stage their blobs in (``ProgressProbe``), which no other writer touches
(docs/decisions/0005-stall-signal.md). A slow but healthy pull is never cut
off. One image failing never stops the others, except a full disk (ENOSPC),
which stops everything not yet started.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from nodeagent.errors import (
    NodeAgentError,
    NoSpaceLeft,
    PullStalled,
    RuntimeCallFailed,
    RuntimeUnreachable,
    TransientError,
)
from nodeagent.ports import (
    ImageRuntime,
    PullEvent,
    PullEventSink,
    PullStep,
    RegistryCredentials,
)

log = structlog.get_logger(__name__)

FAR_ROUND_S = 0.06
"""A round of manifest fetches for disk admission (``disk.MANIFEST_FETCHES_AT_ONCE`` at
once) that takes this long on average says the registry is far: a pull through CRI-O then
waits on about 23 round trips, not on CRI-O's CPU. Measured: about 0.14 s a round over a
50 ms link, 0.03 s on loopback (docs/performance.md, "Pulls in flight from a far
registry")."""
FAR_FACTOR = 3
"""Pulls in flight from a far registry: this many times ``pull.concurrency``. Over the 50 ms
link, 50 images took 21.4 s with 6 in flight, 14.8 s with 12 and 11.6 s with 16 (one
shared-machine run each); on loopback, where CRI-O's CPU is the limit, more in flight
only compete, so the factor applies to far registries alone."""
MAX_IN_FLIGHT = 64
"""The most pulls in flight, whatever the factor (``pull.concurrency``'s own upper bound)."""


def pulls_in_flight(concurrency: int, round_s: float | None) -> int:
    """Pulls to run at once: ``concurrency``, or ``FAR_FACTOR`` times it (at most
    ``MAX_IN_FLIGHT``) when a round of manifest fetches took ``round_s`` of at least
    ``FAR_ROUND_S``; None (nothing fetched, nothing known) keeps ``concurrency``."""
    if round_s is None or round_s < FAR_ROUND_S:
        return concurrency
    return max(concurrency, min(concurrency * FAR_FACTOR, MAX_IN_FLIGHT))


@dataclass(frozen=True, slots=True)
class PullPolicy:
    concurrency: int = 6
    attempts: int = 5
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    stall_timeout_s: float = 300.0
    runtime_wait_s: float = 600.0
    """How long to wait for an unreachable runtime (restarting) before giving up this sync."""
    jitter: float = 0.5
    """Fraction of each backoff delay that is randomized, so retries of many nodes spread out."""
    shared_layer_min_bytes: int = 16 * 1024**2
    """Images sharing a missing layer at least this big wait for the first of them (see
    ``shared_layer_leaders``), so that the layer crosses the network once."""
    pull_deadline_s: float = 24 * 3600.0
    """gRPC deadline of one PullImage: only a backstop. Slowness is judged by the stall
    detector; the CRI client's short call deadline must never cut a healthy pull."""


def backoff_delay_s(attempt: int, policy: PullPolicy, rand: float) -> float:
    """Delay after failed attempt number ``attempt`` (1-based); ``rand`` in [0, 1)."""
    base = min(policy.backoff_initial_s * 2.0 ** (attempt - 1), policy.backoff_max_s)
    return base * (1 - policy.jitter) + base * policy.jitter * rand


def shared_layer_leaders(
    refs: Sequence[str],
    layers: Mapping[str, Sequence[tuple[str, int]]],
    stored: Collection[str],
    min_bytes: int = 0,
) -> dict[str, frozenset[str]]:
    """Which earlier pulls each image waits for, so that a large shared layer is fetched once.

    ``layers`` gives each image's (layer digest, compressed size); images without an
    entry wait for nothing. The first image in ``refs`` that needs a layer of at least
    ``min_bytes`` not in ``stored`` is that layer's leader; a later image needing it waits
    until the leader's pull has ended, then finds the layer in the runtime's store instead
    of downloading it again. Without this, every pull in flight fetches the common base
    layer at the same time (the runtime does not share downloads between pulls).
    """
    leader_of: dict[str, str] = {}
    waits: dict[str, frozenset[str]] = {}
    for ref in refs:
        big = [d for d, size in layers.get(ref, ()) if size >= min_bytes and d not in stored]
        waits[ref] = frozenset(leader_of[d] for d in big if d in leader_of) - {ref}
        for digest in big:
            leader_of.setdefault(digest, ref)
    return waits


def is_retryable(error: NodeAgentError) -> bool:
    """Transient errors and unclassified runtime failures are worth another attempt."""
    return isinstance(error, TransientError | RuntimeCallFailed)


@dataclass(frozen=True, slots=True)
class PullResult:
    ref: str
    is_pulled: bool
    attempts: int
    seconds: float
    reason: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Held:
    """Why a pull was held back and never started (``pull_all``'s ``ready``)."""

    reason: str
    message: str


class ProgressProbe(Protocol):
    """A mark that changes whenever pulls write what they fetch (``adapters.host.StagingProbe``:
    names and sizes of the runtime's staging files).

    Called off the event loop (``run_blocking``). A probe that raises a
    ``NodeAgentError`` gives no signal: no pull is cancelled while it fails.
    """

    def progress_mark(self) -> int: ...


BlockingRunner = Callable[[Callable[[], int]], Awaitable[int]]
"""Runs a blocking call off the event loop (``asyncio.to_thread``); tests run it inline."""


@dataclass
class _Flight:
    task: asyncio.Task[str]
    started_s: float
    is_stalled: bool = False


@dataclass
class _Run:
    inflight: dict[str, _Flight] = field(default_factory=dict)
    disk_full: NoSpaceLeft | None = None
    last_progress_s: float = 0.0
    is_probe_failing: bool = False
    pause_s: float = 0.0
    left: int = 0
    """Pulls not ended yet (no pause after the last one)."""


class PrePuller:
    """Pull a list of references through CRI under a ``PullPolicy``."""

    def __init__(
        self,
        runtime: ImageRuntime,
        credentials_for: Callable[[str], RegistryCredentials | None],
        policy: PullPolicy,
        probe: ProgressProbe | None = None,
        *,
        on_event: PullEventSink | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
        run_blocking: BlockingRunner = asyncio.to_thread,
    ) -> None:
        self.runtime = runtime
        self.credentials_for = credentials_for
        self.policy = policy
        self.probe = probe
        self._emit: PullEventSink = on_event or (lambda _event: None)
        self._sleep = sleep
        self._now = monotonic
        self._rand = rand
        self._run_blocking = run_blocking

    async def pull_all(
        self,
        refs: Sequence[str],
        waits_for: Mapping[str, Collection[str]] | None = None,
        *,
        concurrency: int | None = None,
        pause_s: float = 0.0,
        ready: Callable[[str], Awaitable[Held | None]] | None = None,
    ) -> dict[str, PullResult]:
        """One result per distinct reference, in the order given.

        ``waits_for`` (``shared_layer_leaders``): an image starts only once the pulls it
        names have ended, whatever their outcome; it must name earlier images only.
        ``ready`` (an import's ``bundles.arrivals.ArrivalGate``): awaited before an image
        takes a slot; an image it holds back is not pulled and has its reason.
        ``concurrency`` (default the policy's) caps the pulls at once; each of them keeps its
        slot ``pause_s`` seconds after it ends while other pulls wait (a control plane's pace).
        """
        refs = list(dict.fromkeys(refs))
        run = _Run(last_progress_s=self._now(), pause_s=pause_s, left=len(refs))
        slots = asyncio.Semaphore(concurrency or self.policy.concurrency)
        ended = {ref: asyncio.Event() for ref in refs}
        results: dict[str, PullResult] = {}
        async with asyncio.TaskGroup() as group:
            watchdog = group.create_task(self._watch_stalls(run))
            pulls = [
                group.create_task(
                    self._pull_one(
                        ref, run, slots, ended, (waits_for or {}).get(ref, ()), ready=ready
                    )
                )
                for ref in refs
            ]
            for done in asyncio.as_completed(pulls):
                result = await done
                results[result.ref] = result
            watchdog.cancel()
        return {ref: results[ref] for ref in refs}

    async def _pull_one(
        self,
        ref: str,
        run: _Run,
        slots: asyncio.Semaphore,
        ended: Mapping[str, asyncio.Event],
        leaders: Collection[str],
        *,
        ready: Callable[[str], Awaitable[Held | None]] | None = None,
    ) -> PullResult:
        try:
            for leader in leaders:
                if leader in ended:
                    await ended[leader].wait()
            held = None if ready is None else await ready(ref)
            if held is not None:
                run.left -= 1
                return PullResult(ref, False, 0, 0.0, held.reason, held.message)
            async with slots:
                result = await self._attempts(ref, run)
                run.left -= 1
                if run.pause_s > 0 and run.left > 0:
                    await self._sleep(run.pause_s)
                return result
        finally:
            ended[ref].set()

    async def _attempts(self, ref: str, run: _Run) -> PullResult:
        started_s = self._now()
        attempt = 0
        waited_runtime_s = 0.0
        while run.disk_full is None:
            attempt += 1
            try:
                await self._attempt(ref, run, attempt)
            except NoSpaceLeft as exc:
                run.disk_full = exc
                return self._failed(ref, attempt, started_s, exc)
            except NodeAgentError as exc:
                delay = self._delay_before_retry(exc, attempt, waited_runtime_s)
                if delay is None:
                    return self._failed(ref, attempt, started_s, exc)
                if isinstance(exc, RuntimeUnreachable):
                    attempt -= 1  # a restarting runtime is not this image's fault
                    waited_runtime_s += delay
                self._emit(
                    PullEvent(
                        PullStep.RETRYING,
                        ref,
                        attempt,
                        reason=exc.reason,
                        error=exc.message,
                        retry_in_s=round(delay, 1),
                    )
                )
                await self._sleep(delay)
                continue
            seconds = self._now() - started_s
            self._emit(PullEvent(PullStep.PULLED, ref, attempt, seconds=round(seconds, 1)))
            return PullResult(ref, True, attempt, seconds)
        return self._failed(ref, attempt, started_s, run.disk_full)

    def _delay_before_retry(
        self, exc: NodeAgentError, attempt: int, waited_runtime_s: float
    ) -> float | None:
        """Seconds to wait before the next attempt, or None when the image has failed."""
        if isinstance(exc, RuntimeUnreachable):
            if waited_runtime_s >= self.policy.runtime_wait_s:
                return None
            return max(backoff_delay_s(attempt, self.policy, self._rand()), exc.retry_after_s)
        if not is_retryable(exc) or attempt >= self.policy.attempts:
            return None
        delay = backoff_delay_s(attempt, self.policy, self._rand())
        if isinstance(exc, TransientError):
            delay = max(delay, exc.retry_after_s)
        return delay

    async def _attempt(self, ref: str, run: _Run, attempt: int) -> None:
        self._emit(PullEvent(PullStep.STARTED, ref, attempt))
        creds = self.credentials_for(ref)
        pull = self.runtime.pull_image(ref, creds, timeout_s=self.policy.pull_deadline_s)
        flight = _Flight(asyncio.ensure_future(pull), self._now())
        run.inflight[ref] = flight
        try:
            await flight.task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if flight.is_stalled and (current is None or not current.cancelling()):
                raise PullStalled(
                    f"pull of {ref} made no progress for {self.policy.stall_timeout_s:.0f}s"
                ) from None
            raise
        finally:
            run.inflight.pop(ref, None)
            if not flight.task.done():
                flight.task.cancel()

    def _failed(self, ref: str, attempts: int, started_s: float, exc: NodeAgentError) -> PullResult:
        seconds = self._now() - started_s
        self._emit(
            PullEvent(
                PullStep.FAILED,
                ref,
                attempts,
                seconds=round(seconds, 1),
                reason=exc.reason,
                error=exc.message,
            )
        )
        return PullResult(ref, False, attempts, seconds, exc.reason, exc.message)

    async def _watch_stalls(self, run: _Run) -> None:
        """Cancel pulls during which the staging files have not changed for the stall timeout."""
        probe = self.probe
        if probe is None:
            return
        interval_s = min(max(self.policy.stall_timeout_s / 10, 0.05), 5.0)
        last_mark = await self._mark(probe, run)
        while True:
            await self._sleep(interval_s)
            mark = await self._mark(probe, run)
            now = self._now()
            if mark is None or mark != last_mark:
                # A change is progress; a failed measurement is no evidence of a stall either.
                last_mark, run.last_progress_s = mark, now
            for ref, flight in list(run.inflight.items()):
                idle_s = now - max(flight.started_s, run.last_progress_s)
                if idle_s >= self.policy.stall_timeout_s and not flight.is_stalled:
                    flight.is_stalled = True
                    flight.task.cancel()
                    log.warning("pull_stalled", image=ref, idle_s=round(idle_s))

    async def _mark(self, probe: ProgressProbe, run: _Run) -> int | None:
        """The probe's mark, or None when it failed; logs the transitions only."""
        try:
            mark = await self._run_blocking(probe.progress_mark)
        except NodeAgentError as exc:
            if not run.is_probe_failing:
                log.warning("progress_probe_failed", reason=exc.reason, error=exc.message)
            run.is_probe_failing = True
            return None
        if run.is_probe_failing:
            log.info("progress_probe_recovered")
        run.is_probe_failing = False
        return mark
