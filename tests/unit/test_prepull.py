"""Unit tests of the pre-puller in virtual time: concurrency, retries, backoff, ENOSPC, stalls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from nodeagent.errors import (
    HostFileError,
    ImageNotFound,
    NodeAgentError,
    NoSpaceLeft,
    RegistryAuthFailed,
    RegistryUnavailable,
    RuntimeCallFailed,
    RuntimeTimeout,
    RuntimeUnreachable,
)
from nodeagent.prepull import (
    Held,
    PrePuller,
    PullPolicy,
    backoff_delay_s,
    is_retryable,
    pulls_in_flight,
    shared_layer_leaders,
)
from nodeagent.sync.reconciler import manifest_round_s
from tests.fakes.clock import VirtualClock, run_inline
from tests.fakes.crio import FakeCrio, PullHandler

REFS = [f"r.io/ns/img{i}@sha256:{i:064x}" for i in range(10)]
A, B, C = REFS[:3]

Outcome = NodeAgentError | None
"""What one attempt of a scripted pull does: raise the error, or succeed (None)."""


class Script:
    """Pull outcomes per reference, in order; once a list runs out, pulls succeed."""

    def __init__(self, outcomes: dict[str, list[Outcome]] | None = None) -> None:
        self.outcomes = {ref: list(items) for ref, items in (outcomes or {}).items()}

    async def __call__(self, ref: str) -> None:
        await asyncio.sleep(0)
        pending = self.outcomes.get(ref, [])
        outcome = pending.pop(0) if pending else None
        if outcome is not None:
            raise outcome


class Rig:
    def __init__(
        self,
        policy: PullPolicy,
        pull: PullHandler | None = None,
        probe: Callable[[], int] | None = None,
        rand: float = 0.5,
        clock: VirtualClock | None = None,
    ) -> None:
        self.clock = clock or VirtualClock()
        self.runtime = FakeCrio(pull=pull)
        self.events: list[tuple[str, str, dict[str, object]]] = []
        self.puller = PrePuller(
            self.runtime,
            lambda _ref: None,
            policy,
            None if probe is None else _Probe(probe),
            on_event=lambda ev: self.events.append((ev.step.value, ev.ref, ev.fields())),
            sleep=self.clock.sleep,
            monotonic=self.clock.monotonic,
            rand=lambda: rand,
            run_blocking=run_inline,
        )


class _Probe:
    def __init__(self, used: Callable[[], int]) -> None:
        self._used = used

    def progress_mark(self) -> int:
        return self._used()


# ---------------------------------------------------------------- backoff
POLICY = PullPolicy(backoff_initial_s=1.0, backoff_max_s=10.0, jitter=0.5)


@pytest.mark.parametrize(
    ("attempt", "rand", "delay"),
    [
        (1, 0.0, 0.5),
        (1, 0.5, 0.75),
        (1, 0.999, 0.9995),
        (2, 0.0, 1.0),
        (3, 0.5, 3.0),
        (4, 1.0, 8.0),
        (5, 0.0, 5.0),  # 16 s capped at 10 s, then half of it is jitter
        (5, 0.999, 9.995),
        (30, 0.0, 5.0),
    ],
)
def test_backoff_doubles_from_initial_to_max_with_jitter(
    attempt: int, rand: float, delay: float
) -> None:
    assert backoff_delay_s(attempt, POLICY, rand) == pytest.approx(delay)


@pytest.mark.parametrize("attempt", range(1, 8))
@pytest.mark.parametrize("jitter", [0.0, 0.25, 1.0])
def test_jitter_spreads_delays_over_the_top_fraction_of_the_base(
    attempt: int, jitter: float
) -> None:
    policy = PullPolicy(backoff_initial_s=1.0, backoff_max_s=30.0, jitter=jitter)
    base = min(2.0 ** (attempt - 1), 30.0)
    low = backoff_delay_s(attempt, policy, 0.0)
    high = backoff_delay_s(attempt, policy, 0.9999)
    assert low == pytest.approx(base * (1 - jitter))
    assert high == pytest.approx(base * (1 - jitter) + base * jitter * 0.9999)
    assert low <= high <= base


@pytest.mark.parametrize(
    ("error", "is_retried"),
    [
        (RuntimeUnreachable("x"), True),
        (RuntimeTimeout("x"), True),
        (RegistryUnavailable("x"), True),
        (RuntimeCallFailed("x"), True),
        (ImageNotFound("x"), False),
        (RegistryAuthFailed("x"), False),
        (NoSpaceLeft("x"), False),
    ],
)
def test_is_retryable(error: NodeAgentError, is_retried: bool) -> None:
    assert is_retryable(error) is is_retried


# ---------------------------------------------------------------- concurrency
@pytest.mark.parametrize("concurrency", [1, 3, 10])
async def test_concurrency_bound_is_reached_and_never_exceeded(concurrency: int) -> None:
    async def slow(_ref: str) -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    rig = Rig(PullPolicy(concurrency=concurrency), pull=slow)
    results = await rig.puller.pull_all(REFS)
    assert rig.runtime.max_inflight == concurrency
    assert all(r.is_pulled and r.attempts == 1 for r in results.values())
    assert list(results) == REFS
    assert sorted(rig.runtime.pull_calls) == sorted(REFS)


async def test_control_plane_pace_one_at_a_time_with_a_pause_between_pulls() -> None:
    starts: list[float] = []
    clock = VirtualClock(start_s=0.0)

    async def timed(_ref: str) -> None:
        starts.append(clock.now_s)
        await asyncio.sleep(0)

    rig = Rig(PullPolicy(concurrency=6), pull=timed, clock=clock)
    results = await rig.puller.pull_all([A, B, C], concurrency=1, pause_s=1.5)
    assert all(r.is_pulled for r in results.values())
    assert rig.runtime.max_inflight == 1
    assert starts == [0.0, 1.5, 3.0]
    assert clock.sleeps == [1.5, 1.5]  # no pause after the last pull


async def test_without_pace_pulls_do_not_pause() -> None:
    clock = VirtualClock(start_s=0.0)
    rig = Rig(PullPolicy(concurrency=6), pull=Script(), clock=clock)
    await rig.puller.pull_all([A, B, C])
    assert clock.sleeps == []
    assert rig.runtime.max_inflight == 3


async def test_duplicate_references_are_pulled_once() -> None:
    rig = Rig(PullPolicy(concurrency=4), pull=Script())
    results = await rig.puller.pull_all([A, B, A])
    assert list(results) == [A, B]
    assert sorted(rig.runtime.pull_calls) == [A, B]


@pytest.mark.parametrize("deadline_s", [7.0, 24 * 3600.0])
async def test_pulls_get_the_policy_deadline_not_the_short_call_deadline(deadline_s: float) -> None:
    rig = Rig(PullPolicy(pull_deadline_s=deadline_s), pull=Script())
    await rig.puller.pull_all([A, B])
    assert rig.runtime.pull_timeouts == [deadline_s, deadline_s]


async def test_an_image_held_back_by_ready_is_not_pulled_and_gives_its_reason() -> None:
    """``ready`` (an import's arrival gate, decision 0081) is awaited before each pull takes
    a slot: the images it lets go are pulled, one it holds back never reaches the runtime."""
    held = Held("BundleDigestMismatch", "blobs/sha256/44… does not match bundle.json")
    asked: list[str] = []

    async def ready(ref: str) -> Held | None:
        asked.append(ref)
        return held if ref == B else None

    rig = Rig(PullPolicy(concurrency=2))
    results = await rig.puller.pull_all([A, B, C], ready=ready)
    assert sorted(asked) == sorted([A, B, C])
    assert sorted(rig.runtime.pull_calls) == sorted([A, C])
    assert (results[B].is_pulled, results[B].attempts) == (False, 0)
    assert (results[B].reason, results[B].message) == (held.reason, held.message)
    assert results[A].is_pulled and results[C].is_pulled


async def test_nothing_to_pull() -> None:
    rig = Rig(PullPolicy(), pull=Script(), probe=lambda: 0)
    assert await rig.puller.pull_all([]) == {}


# ---------------------------------------------------------------- shared layers first
BASE, OTHER_BASE = "sha256:base", "sha256:other"


MIB = 1024**2


def _sized(layers: dict[str, list[str]], size: int = 20 * MIB) -> dict[str, list[tuple[str, int]]]:
    return {ref: [(digest, size) for digest in digests] for ref, digests in layers.items()}


@pytest.mark.parametrize(
    ("layers", "stored", "expected"),
    [
        # one base under every image: the first pulls it, all others wait for that one
        (
            {A: [BASE, "a"], B: [BASE, "b"], C: [BASE, "c"]},
            set(),
            {A: set(), B: {A}, C: {A}},
        ),
        # the base is stored already: nobody waits
        ({A: [BASE, "a"], B: [BASE, "b"], C: [BASE, "c"]}, {BASE}, {A: set(), B: set(), C: set()}),
        # two bases: each image waits for the leader of each shared layer it needs
        (
            {A: [BASE, "a"], B: [OTHER_BASE, "b"], C: [BASE, OTHER_BASE, "c"]},
            set(),
            {A: set(), B: set(), C: {A, B}},
        ),
        # nothing shared, or no manifest known: nobody waits
        ({A: ["a"], B: ["b"]}, set(), {A: set(), B: set(), C: set()}),
        # an image listing a layer twice does not wait for itself
        ({A: [BASE, BASE], B: [BASE]}, set(), {A: set(), B: {A}, C: set()}),
    ],
)
def test_shared_layer_leaders(
    layers: dict[str, list[str]], stored: set[str], expected: dict[str, set[str]]
) -> None:
    assert shared_layer_leaders([A, B, C], _sized(layers), stored, 16 * MIB) == expected


@pytest.mark.parametrize(("size", "waits"), [(16 * MIB - 1, False), (16 * MIB, True)])
def test_only_shared_layers_of_the_minimum_size_make_images_wait(size: int, waits: bool) -> None:
    layers = _sized({A: [BASE], B: [BASE]}, size)
    leaders = shared_layer_leaders([A, B], layers, set(), 16 * MIB)
    assert leaders[B] == ({A} if waits else set())


async def test_images_wait_for_their_leader_then_run_in_parallel() -> None:
    order: list[str] = []

    async def pull(ref: str) -> None:
        order.append(f"start {ref}")
        for _ in range(3):
            await asyncio.sleep(0)
        order.append(f"end {ref}")

    rig = Rig(PullPolicy(concurrency=4), pull=pull)
    waits = shared_layer_leaders([A, B, C], _sized({r: [BASE] for r in (A, B, C)}), set())
    results = await rig.puller.pull_all([A, B, C], waits)
    assert order[:2] == [f"start {A}", f"end {A}"]
    assert sorted(order[2:4]) == [f"start {B}", f"start {C}"]  # then both at once
    assert rig.runtime.max_inflight == 2
    assert all(r.is_pulled for r in results.values())


async def test_a_failed_leader_releases_the_images_waiting_for_it() -> None:
    rig = Rig(PullPolicy(attempts=1), pull=Script({A: [ImageNotFound("gone")]}))
    results = await rig.puller.pull_all([A, B], {B: {A}})
    assert not results[A].is_pulled
    assert results[B].is_pulled
    assert rig.runtime.pull_calls == [A, B]


# ---------------------------------------------------------------- retries
async def test_retries_wait_exactly_the_backoff_delays() -> None:
    policy = PullPolicy(attempts=5, backoff_initial_s=1.0, backoff_max_s=4.0, jitter=0.5)
    rig = Rig(policy, pull=Script({A: [RuntimeCallFailed("rejected")] * 9}), rand=0.25)
    result = (await rig.puller.pull_all([A]))[A]
    assert (result.is_pulled, result.attempts, result.reason) == (False, 5, "RuntimeCallFailed")
    assert result.message == "rejected"
    assert rig.clock.sleeps == pytest.approx([0.625, 1.25, 2.5, 2.5])
    assert rig.clock.sleeps == [backoff_delay_s(n, policy, 0.25) for n in range(1, 5)]
    assert rig.runtime.pull_calls == [A] * 5
    assert result.seconds == pytest.approx(sum(rig.clock.sleeps))


@pytest.mark.parametrize(
    ("error", "delays"),
    [
        (RegistryUnavailable("503", retry_after_s=0.0), [0.75, 1.5]),
        (RegistryUnavailable("503"), [5.0, 5.0]),  # the error's own retry-after is a floor
        (RuntimeCallFailed("internal"), [0.75, 1.5]),
        (RuntimeTimeout("deadline", retry_after_s=0.0), [0.75, 1.5]),
    ],
)
async def test_retryable_errors_are_retried_until_success(
    error: NodeAgentError, delays: list[float]
) -> None:
    rig = Rig(PullPolicy(attempts=3), pull=Script({A: [error, error]}))
    result = (await rig.puller.pull_all([A]))[A]
    assert (result.is_pulled, result.attempts, result.reason) == (True, 3, None)
    assert rig.clock.sleeps == pytest.approx(delays)
    retrying = [f for e, _, f in rig.events if e == "pull_retrying"]
    assert [f["attempt"] for f in retrying] == [1, 2]


async def test_retryable_error_fails_after_the_last_attempt() -> None:
    rig = Rig(PullPolicy(attempts=3), pull=Script({A: [RegistryUnavailable("503")] * 5}))
    result = (await rig.puller.pull_all([A]))[A]
    assert (result.is_pulled, result.attempts, result.reason) == (False, 3, "RegistryUnavailable")
    assert rig.runtime.pull_calls == [A] * 3
    assert [e for e, _, _ in rig.events].count("pull_failed") == 1


@pytest.mark.parametrize(
    "error",
    [ImageNotFound("no such manifest"), RegistryAuthFailed("401 from r.io")],
)
async def test_permanent_errors_fail_at_once_with_their_reason(error: NodeAgentError) -> None:
    rig = Rig(PullPolicy(attempts=5), pull=Script({A: [error]}))
    result = (await rig.puller.pull_all([A]))[A]
    assert (result.is_pulled, result.attempts) == (False, 1)
    assert (result.reason, result.message) == (error.reason, error.message)
    assert rig.runtime.pull_calls == [A]
    assert rig.clock.sleeps == []


async def test_one_failing_image_does_not_stop_the_others() -> None:
    rig = Rig(
        PullPolicy(concurrency=2, attempts=2),
        pull=Script({A: [ImageNotFound("gone")], B: [RuntimeCallFailed("x")] * 2}),
    )
    results = await rig.puller.pull_all([A, B, C, REFS[3]])
    assert {ref: r.reason for ref, r in results.items()} == {
        A: "ImageNotFound",
        B: "RuntimeCallFailed",
        C: None,
        REFS[3]: None,
    }
    assert results[C].is_pulled and results[REFS[3]].is_pulled


# ---------------------------------------------------------------- disk full
async def test_no_space_left_stops_pulls_not_yet_started() -> None:
    rig = Rig(PullPolicy(concurrency=1, attempts=5), pull=Script({A: [NoSpaceLeft("ENOSPC")]}))
    results = await rig.puller.pull_all([A, B, C])
    assert rig.runtime.pull_calls == [A]
    assert (results[A].reason, results[A].attempts) == ("NoSpaceLeft", 1)
    for ref in (B, C):
        assert (results[ref].is_pulled, results[ref].attempts) == (False, 0)
        assert (results[ref].reason, results[ref].message) == ("NoSpaceLeft", "ENOSPC")
    assert rig.clock.sleeps == []


async def test_no_space_left_lets_pulls_in_flight_finish() -> None:
    async def pull(ref: str) -> None:
        if ref == A:
            raise NoSpaceLeft("ENOSPC")
        for _ in range(10):  # B is still in flight when A fails
            await asyncio.sleep(0)

    rig = Rig(PullPolicy(concurrency=2), pull=pull)
    results = await rig.puller.pull_all([A, B, C])
    assert results[B].is_pulled
    assert (results[C].reason, results[C].attempts) == ("NoSpaceLeft", 0)
    assert C not in rig.runtime.pull_calls


async def test_no_space_left_ends_retries_of_other_images() -> None:
    async def pull(ref: str) -> None:
        await asyncio.sleep(0)
        if ref == A:
            raise RuntimeCallFailed("flaky")
        raise NoSpaceLeft("ENOSPC")

    rig = Rig(PullPolicy(concurrency=2, attempts=5), pull=pull)
    results = await rig.puller.pull_all([A, B])
    assert (results[A].reason, results[A].attempts) == ("NoSpaceLeft", 1)
    assert rig.runtime.pull_calls.count(A) == 1


# ---------------------------------------------------------------- runtime restarts
async def test_unreachable_runtime_does_not_consume_attempts() -> None:
    down = RuntimeUnreachable("connection refused")
    script = Script({A: [down, down, down, RuntimeCallFailed("x"), down, None]})
    rig = Rig(PullPolicy(attempts=2, runtime_wait_s=10.0), pull=script)
    result = (await rig.puller.pull_all([A]))[A]
    assert (result.is_pulled, result.attempts) == (True, 2)
    assert len(rig.runtime.pull_calls) == 6
    # each wait is at least the error's retry-after (2 s); backoff is 1 s at most here
    assert rig.clock.sleeps == pytest.approx([2.0, 2.0, 2.0, 0.75, 2.0])


async def test_unreachable_runtime_fails_once_runtime_wait_is_exhausted() -> None:
    rig = Rig(
        PullPolicy(attempts=1, runtime_wait_s=10.0),
        pull=Script({A: [RuntimeUnreachable("connection refused")] * 100}),
    )
    result = (await rig.puller.pull_all([A]))[A]
    assert (result.is_pulled, result.reason) == (False, "RuntimeUnreachable")
    assert rig.clock.sleeps == pytest.approx([2.0] * 5)
    assert len(rig.runtime.pull_calls) == 6


# ---------------------------------------------------------------- stalls
STALL_S = 60.0


class Timeline:
    """Start and cancellation times of a fake pull, in virtual time."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.started: list[float] = []
        self.cancelled: list[float] = []

    async def hang(self, _ref: str) -> None:
        self.started.append(self.clock.now_s)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(self.clock.now_s)
            raise

    async def take(self, duration_s: float) -> None:
        self.started.append(self.clock.now_s)
        try:
            await self.clock.until(self.clock.now_s + duration_s)
        except asyncio.CancelledError:
            self.cancelled.append(self.clock.now_s)
            raise


def stall_rig(
    pull_of: Callable[[Timeline], PullHandler],
    used: Callable[[VirtualClock], int],
    attempts: int = 3,
) -> tuple[Rig, Timeline]:
    clock = VirtualClock()
    timeline = Timeline(clock)
    policy = PullPolicy(attempts=attempts, stall_timeout_s=STALL_S)
    rig = Rig(policy, pull=pull_of(timeline), probe=lambda: used(clock), clock=clock)
    return rig, timeline


async def test_stalled_pull_is_cancelled_and_retried_then_fails_as_stalled() -> None:
    rig, timeline = stall_rig(lambda t: t.hang, used=lambda _clock: 5 * 1024**3)
    result = (await rig.puller.pull_all([A]))[A]
    assert (result.is_pulled, result.attempts, result.reason) == (False, 3, "PullStalled")
    assert rig.runtime.pull_calls == [A] * 3
    idle = [end - start for start, end in zip(timeline.started, timeline.cancelled, strict=True)]
    assert len(idle) == 3
    # detected within one watchdog interval (stall timeout / 10) after the timeout
    assert all(STALL_S <= seconds <= STALL_S + STALL_S / 10 for seconds in idle), idle


async def test_slow_but_growing_pull_is_never_cancelled() -> None:
    rig, timeline = stall_rig(
        lambda t: lambda _ref: t.take(10 * STALL_S),
        used=lambda clock: int(clock.now_s * 1000),
    )
    result = (await rig.puller.pull_all([A]))[A]
    assert (result.is_pulled, result.attempts) == (True, 1)
    assert timeline.cancelled == []
    assert result.seconds >= 10 * STALL_S
    assert rig.runtime.pull_calls == [A]


async def test_stall_is_measured_from_the_last_growth_not_from_the_start() -> None:
    growth_ends_s = 1000.0 + 5 * STALL_S

    def used(clock: VirtualClock) -> int:
        return int(min(clock.now_s, growth_ends_s))

    rig, timeline = stall_rig(lambda t: t.hang, used=used, attempts=1)
    result = (await rig.puller.pull_all([A]))[A]
    assert result.reason == "PullStalled"
    assert len(timeline.started) == 1
    assert timeline.started[0] < growth_ends_s - STALL_S
    stalled_after_s = timeline.cancelled[0] - growth_ends_s
    assert STALL_S <= stalled_after_s <= STALL_S + STALL_S / 10


async def test_failing_probe_gives_no_signal_and_cancels_nothing() -> None:
    def broken(_clock: VirtualClock) -> int:
        raise HostFileError("cannot measure /var/lib/containers")

    rig, timeline = stall_rig(lambda t: lambda _ref: t.take(10 * STALL_S), used=broken)
    result = (await rig.puller.pull_all([A]))[A]
    assert (result.is_pulled, result.attempts) == (True, 1)
    assert timeline.cancelled == []


async def test_without_probe_no_pull_is_cancelled() -> None:
    async def pull(_ref: str) -> None:
        for _ in range(100):
            await asyncio.sleep(0)

    rig = Rig(PullPolicy(stall_timeout_s=0.0), pull=pull)
    result = (await rig.puller.pull_all([A]))[A]
    assert result.is_pulled
    assert rig.clock.sleeps == []


@pytest.mark.parametrize(
    ("concurrency", "round_s", "expected"),
    [
        (6, None, 6),  # nothing fetched: nothing known
        (6, 0.03, 6),  # loopback: CRI-O's CPU is the limit
        (6, 0.06, 18),
        (6, 0.14, 18),  # a 50 ms link
        (1, 0.5, 3),
        (30, 0.5, 64),  # never above pull.concurrency's own bound
        (64, 0.5, 64),
    ],
)
def test_pulls_in_flight_grow_only_for_a_far_registry(
    concurrency: int, round_s: float | None, expected: int
) -> None:
    assert pulls_in_flight(concurrency, round_s) == expected


def test_a_round_of_manifest_fetches_is_its_time_over_its_rounds_of_eight() -> None:
    missing = {"a": [f"r{i}" for i in range(20)], "b": ["r0", "r1"]}  # 20 distinct: 3 rounds
    assert manifest_round_s(missing, 0.6) == pytest.approx(0.2)
    assert manifest_round_s({}, 0.6) is None
