"""The Reconciler wired with real services over in-memory ports, in virtual time.

Real: ``PinService``, ``PrePuller``, ``DiskAdmission``, the ledger, the status builders.
Fake: the runtime (``FakeCrio``, which pins like CRI-O), the drop-in files, the reloader,
registry manifests, the filesystem's free space, the state directory and the report.
The sync loop runs with an injected ``monotonic`` and ``wait`` (``LoopClock``), so its
retries, backoff, boot grace and resync interval are seen as exact numbers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from nodeagent.disk import DiskAdmission, DiskPolicy, ImageLayers
from nodeagent.errors import (
    ImageNotFound,
    NodeAgentError,
    PinsOverridden,
    RuntimeCallFailed,
    RuntimeDoesNotPin,
    RuntimeUnreachable,
)
from nodeagent.pins import ConfigFile, PinService, render_dropin
from nodeagent.ports import RegistryCredentials
from nodeagent.prepull import PrePuller, PullPolicy
from nodeagent.references import parse_pinned_image_ref
from nodeagent.reporting import Reporter
from nodeagent.specs import PinnedImageSet, SpecLoad
from nodeagent.status import NodeStatus, SetStatus
from nodeagent.sync import Reconciler, SyncSchedule
from tests.fakes.clock import VirtualClock, run_inline
from tests.fakes.crio import MemoryDropins, crio_config
from tests.fakes.ports import (
    FakeManifests,
    FixedSpace,
    FlakyCrio,
    LoopClock,
    MemoryStore,
    RecordingLine,
    RecordingReport,
    until,
)
from tests.fakes.reloader import RecordingReloader

GIB = 1024**3
MIB = 1024**2
A = "quay.io/ns/app-a@sha256:" + "a" * 64
B = "quay.io/ns/app-b@sha256:" + "b" * 64
C = "quay.io/ns/app-c@sha256:" + "c" * 64
D = "quay.io/ns/app-d@sha256:" + "d" * 64
BOOT = "boot-1"


def image_set(
    name: str, *refs: str, generation: int | None = None, is_persistent: bool = True
) -> PinnedImageSet:
    return PinnedImageSet(
        name=name,
        images=tuple(parse_pinned_image_ref(ref) for ref in refs),
        generation=generation,
        source=f"/etc/nodeagent/pinnedimagesets/{name}.yaml",
        is_persistent=is_persistent,
    )


class Node:
    """One node's services, wired like ``daemon.wiring.build`` but over fakes."""

    def __init__(
        self,
        *sets: PinnedImageSet,
        crio: FlakyCrio | None = None,
        others: Sequence[ConfigFile] = (),
        sizes: Mapping[str, int] | None = None,
        available_bytes: int = 50 * GIB,
        failing: Mapping[str, NodeAgentError] | None = None,
        store: MemoryStore | None = None,
        schedule: SyncSchedule | None = None,
        loop: LoopClock | None = None,
    ) -> None:
        self.specs = SpecLoad(tuple(sets))
        self.failing = dict(failing or {})
        self.clock = VirtualClock()
        self.loop = loop or LoopClock()
        self.crio = crio or FlakyCrio()
        self.crio.pull_handler = self._pull
        self.dropins = MemoryDropins(others)
        self.crio.start(self.dropins.texts_in_crio_order())
        self.reloader = RecordingReloader(self.dropins, self.crio)
        self.pins = PinService(
            self.dropins,
            self.reloader,
            self.crio,
            verify_timeout_s=20.0,
            sleep=self.clock.sleep,
            monotonic=self.clock.monotonic,
        )
        self.puller = PrePuller(
            self.crio,
            lambda _ref: None,
            PullPolicy(attempts=2, backoff_initial_s=1.0, jitter=0.0),
            sleep=self.clock.sleep,
            monotonic=self.clock.monotonic,
            rand=lambda: 0.5,
            run_blocking=run_inline,
        )
        self.manifests = FakeManifests(sizes or dict.fromkeys((A, B, C, D), 100 * MIB))
        self.space = FixedSpace(total_bytes=100 * GIB, available_bytes=available_bytes)
        self.admission = DiskAdmission(
            runtime=self.crio,
            manifests=self.manifests,
            space=self.space,
            credentials_for=lambda _ref: None,
            policy=DiskPolicy(expansion_factor=2.0, reserve_bytes=1 * GIB),
        )
        self.store = store or MemoryStore()
        self.report = RecordingReport(self.loop.monotonic)
        self.reconciler = Reconciler(
            load_specs=lambda: self.specs,
            runtime=self.crio,
            pins=self.pins,
            puller=self.puller,
            admission=self.admission,
            store=self.store,
            boot_id=BOOT,
            report=self.report,
            schedule=schedule,
            monotonic=self.loop.monotonic,
            wait=self.loop.wait,
        )

    async def _pull(self, ref: str) -> None:
        await asyncio.sleep(0)
        error = self.failing.get(ref)
        if error is not None:
            raise error

    def use(self, *sets: PinnedImageSet) -> None:
        self.specs = SpecLoad(tuple(sets))

    def ledger(self, name: str) -> dict[str, object]:
        doc = self.store.docs["ledger"]
        assert doc["bootId"] == BOOT
        sets: dict[str, dict[str, object]] = doc["sets"]
        return sets[name]

    async def run_until_parked(self) -> None:
        """Run the sync loop until its ``park_after``-th wait, then cancel it."""
        task = asyncio.create_task(self.reconciler.run())
        try:
            await asyncio.wait_for(self.loop.parked.wait(), 5)
        finally:
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def by_name(status: NodeStatus) -> dict[str, SetStatus]:
    return {s.name: s for s in status.sets}


def condition(status: NodeStatus, kind: str) -> tuple[bool, str]:
    found = next(c for c in status.conditions if c.type == kind)
    return found.is_true, found.reason


# ---------------------------------------------------------------- one sync
async def test_set_whose_images_all_pull_is_pinned_and_its_generation_recorded() -> None:
    node = Node(image_set("apps", A, B, generation=3))

    status = await node.reconciler.sync()

    apps = by_name(status)["apps"]
    assert (apps.state, apps.reason, apps.images_present, apps.images_pinned) == (
        "Pinned",
        None,
        2,
        2,
    )
    assert (apps.desired_generation, apps.current_generation) == (3, 3)
    assert sorted(node.crio.pull_calls) == [A, B]
    assert node.crio.pinned_names() == {A: True, B: True}
    assert node.reloader.calls == 1
    assert node.ledger("apps")["currentGeneration"] == 3
    assert node.ledger("apps")["pinnedImages"] == [A, B]
    assert condition(status, "Ready") == (True, "AllPinned")
    assert status.last_error is None
    assert status.disk is not None
    assert status.disk.needed_bytes == 2 * 2 * 100 * MIB  # expansion factor 2
    # while the pulls ran, the set was reported Progressing with both images pending
    interim = by_name(node.report.progress[0])["apps"]
    assert (interim.state, sorted(interim.pending)) == ("Progressing", [A, B])


async def test_second_sync_with_nothing_missing_pulls_and_reloads_nothing() -> None:
    node = Node(image_set("apps", A))
    await node.reconciler.sync()

    status = await node.reconciler.sync()

    assert by_name(status)["apps"].state == "Pinned"
    assert node.crio.pull_calls == [A]
    assert node.reloader.calls == 1
    assert node.manifests.asked == [A]  # admission is skipped when nothing is missing
    assert len(node.report.progress) == 1


OVERRIDING = ConfigFile(
    "/etc/crio/crio.conf.d/99-zz-vendor.conf", crio_config(["vendor/agent:1"]), True
)


@pytest.mark.parametrize(
    ("crio", "others", "pin_error"),
    [
        pytest.param(FlakyCrio(), [OVERRIDING], PinsOverridden, id="overridden"),
        pytest.param(
            FlakyCrio(version="1.27.2", is_pinning=False), [], RuntimeDoesNotPin, id="old-crio"
        ),
    ],
)
async def test_pin_error_with_failed_pulls_degrades_by_first_failure_and_reports_pin_error(
    crio: FlakyCrio, others: list[ConfigFile], pin_error: type[NodeAgentError]
) -> None:
    node = Node(
        image_set("apps", A, B, C),
        image_set("base", D),
        crio=crio,
        others=others,
        failing={B: ImageNotFound(f"{B}: manifest unknown"), C: ImageNotFound("gone too")},
    )

    status = await node.reconciler.sync()

    apps, base = by_name(status)["apps"], by_name(status)["base"]
    assert (apps.state, apps.reason) == ("Degraded", "ImageNotFound")
    assert [f.ref for f in apps.failures] == [B, C]
    assert (base.state, base.reason) == ("Degraded", pin_error.reason)
    assert (apps.images_pinned, base.images_pinned) == (0, 0)
    assert status.last_error is not None
    assert base.last_failed_error == status.last_error
    assert node.ledger("base")["lastFailedError"] == status.last_error
    assert node.ledger("apps")["lastFailedGeneration"] == 1
    assert str(node.ledger("apps")["lastFailedError"]).startswith(
        f"2 image(s) failed; first {B}: ImageNotFound: "
    )
    assert "currentGeneration" not in node.ledger("apps")
    assert "currentGeneration" not in node.ledger("base")
    assert condition(status, "Degraded") == (True, "ImageNotFound")
    assert node.crio.pinned_names()[D] is False
    assert sorted(node.crio.pull_calls) == [A, B, C, D]  # ImageNotFound is not retried


async def test_pins_overridden_names_the_overriding_file() -> None:
    node = Node(image_set("base", D), others=[OVERRIDING])

    status = await node.reconciler.sync()

    assert by_name(status)["base"].reason == "PinsOverridden"
    assert status.last_error is not None
    assert status.last_error.startswith(OVERRIDING.path)
    # the verification waited its whole timeout (virtual) before blaming the file
    assert node.clock.now_s - 1000.0 >= 20.0


async def test_set_refused_for_disk_space_pulls_nothing_and_the_set_that_fits_is_pinned() -> None:
    node = Node(
        image_set("apps", A, B),
        image_set("small", C),
        sizes={A: 600 * MIB, B: 600 * MIB, C: 100 * MIB},
        available_bytes=2 * GIB,
    )

    status = await node.reconciler.sync()

    apps, small = by_name(status)["apps"], by_name(status)["small"]
    assert (apps.state, apps.reason) == ("Refused", "InsufficientDiskSpace")
    assert (apps.images_present, apps.images_pinned, apps.bytes_to_pull) == (0, 0, 1200 * MIB)
    assert apps.last_failed_error is not None
    assert apps.last_failed_error.startswith("not enough disk space: needs 2.5 GiB")
    assert (small.state, small.images_pinned) == ("Pinned", 1)
    assert node.crio.pull_calls == [C]
    assert node.space.asked == ["/var/lib/containers/storage/overlay-images"]
    assert status.disk is not None
    assert (status.disk.needed_bytes, status.disk.reserve_bytes) == (200 * MIB, GIB)
    assert node.ledger("apps")["lastFailedError"] == apps.last_failed_error
    assert condition(status, "Degraded") == (True, "InsufficientDiskSpace")
    interim = by_name(node.report.progress[0])
    assert (interim["apps"].state, interim["small"].state) == ("Refused", "Progressing")


async def test_new_generation_with_a_missing_image_keeps_the_previous_generations_pins() -> None:
    node = Node(image_set("apps", A, B))
    await node.reconciler.sync()
    node.use(image_set("apps", A, C))
    node.failing[C] = ImageNotFound(f"{C}: manifest unknown")

    status = await node.reconciler.sync()

    apps = by_name(status)["apps"]
    assert (apps.state, apps.reason) == ("Degraded", "ImageNotFound")
    assert (apps.desired_generation, apps.current_generation) == (2, 1)
    assert apps.last_failed_generation == 2
    assert node.crio.pinned_names() == {A: True, B: True}
    assert node.ledger("apps")["pinnedImages"] == [A, B]
    assert node.ledger("apps")["currentGeneration"] == 1

    del node.failing[C]
    status = await node.reconciler.sync()

    apps = by_name(status)["apps"]
    assert (apps.state, apps.desired_generation, apps.current_generation) == ("Pinned", 2, 2)
    assert apps.last_failed_generation is None
    assert node.crio.pinned_names() == {A: True, B: False, C: True}
    assert node.ledger("apps")["pinnedImages"] == [A, C]


async def test_removed_set_releases_its_pins_and_leaves_the_ledger() -> None:
    node = Node(image_set("apps", A), image_set("base", B))
    await node.reconciler.sync()
    assert node.crio.pinned_names() == {A: True, B: True}
    node.use(image_set("apps", A))

    with capture_logs() as logs:
        status = await node.reconciler.sync()

    assert [s.name for s in status.sets] == ["apps"]
    assert [e["set"] for e in logs if e["event"] == "set_removed"] == ["base"]
    assert [e["image"] for e in logs if e["event"] == "image_unpinned"] == [B]
    assert node.crio.pinned_names() == {A: True, B: False}
    assert set(node.store.docs["ledger"]["sets"]) == {"apps"}
    assert node.dropins.text is not None
    assert A in node.dropins.text
    assert B not in node.dropins.text
    assert node.reloader.calls == 2


async def test_boot_restores_remembered_pins_without_reloading_and_the_first_sync_reloads() -> None:
    ledger = {
        "bootId": "boot-0",
        "sets": {
            "apps": {"desiredGeneration": 1, "currentGeneration": 1, "persistent": True,
                     "pinnedImages": [A]},
            "scratch": {"desiredGeneration": 1, "currentGeneration": 1, "persistent": False,
                        "pinnedImages": [B]},
        },
    }  # fmt: skip
    node = Node(image_set("apps", A), store=MemoryStore({"ledger": ledger}))
    node.crio.store(A)
    node.crio.store(B)
    # the previous run wrote this drop-in and died before the reload: CRI-O never read it
    node.dropins.text = render_dropin([A])

    await node.reconciler.boot()

    assert node.dropins.text == render_dropin([A])  # a transient set of boot-0 is forgotten
    assert node.dropins.writes == 1
    assert node.reloader.calls == 0
    assert node.crio.pinned_names() == {A: False, B: False}

    status = await node.reconciler.sync()

    assert node.reloader.calls == 1  # the reload owed since boot, although the bytes match
    assert node.crio.pull_calls == []
    assert by_name(status)["apps"].state == "Pinned"
    assert node.crio.pinned_names() == {A: True, B: False}


# ---------------------------------------------------------------- the sync loop
def unreachable() -> RuntimeUnreachable:
    return RuntimeUnreachable("cannot connect to /run/crio/crio.sock")


async def test_unreachable_runtime_at_boot_is_retried_with_doubling_delays_then_syncs() -> None:
    node = Node(
        image_set("apps", A),
        crio=FlakyCrio(version_script=[unreachable() for _ in range(5)]),
        schedule=SyncSchedule(
            resync_interval_s=600, retry_initial_s=1, retry_max_s=8, boot_grace_s=60
        ),
        loop=LoopClock(park_after=7),
    )

    with capture_logs() as logs:
        await node.run_until_parked()

    assert node.loop.waits == [1, 2, 4, 8, 8, 600, 600]
    assert node.report.kinds() == [
        *["started", "failed"] * 5,
        *("started", "progress", "finished"),  # the first sync that ran pulled A
        *("started", "finished"),
    ]
    starts = [t for kind, t in node.report.events if kind == "started"]
    assert starts == [0, 1, 3, 7, 15, 23, 623]
    assert [e.reason for e in node.report.failures] == ["RuntimeUnreachable"] * 5
    assert by_name(node.report.finished[0])["apps"].state == "Pinned"
    postponed = [(e["event"], e["log_level"]) for e in logs if "retry_in_s" in e]
    assert postponed == [("runtime_awaited", "info")] * 5
    assert [e["retry_in_s"] for e in logs if "retry_in_s" in e] == [1, 2, 4, 8, 8]


async def test_unreachable_runtime_after_the_boot_grace_is_a_warning() -> None:
    node = Node(
        crio=FlakyCrio(version_script=[unreachable() for _ in range(4)]),
        schedule=SyncSchedule(retry_initial_s=1, retry_max_s=60, boot_grace_s=5),
        loop=LoopClock(park_after=5),
    )

    with capture_logs() as logs:
        await node.run_until_parked()

    assert node.loop.waits == [1, 2, 4, 8, 600]
    postponed = [(e["event"], e["log_level"]) for e in logs if "retry_in_s" in e]
    assert postponed == [("runtime_awaited", "info")] * 3 + [("sync_postponed", "warning")]
    assert node.report.kinds()[-2:] == ["started", "finished"]


async def test_runtime_lost_after_it_answered_is_a_warning_and_backoff_restarts_after_success() -> (
    None
):
    node = Node(
        image_set("apps", A),
        # the first sync asks twice: at its start, and before pinning on a new drop-in
        crio=FlakyCrio(
            version_script=[None, None, unreachable(), unreachable(), None, unreachable()]
        ),
        schedule=SyncSchedule(
            resync_interval_s=10, retry_initial_s=1, retry_max_s=60, boot_grace_s=600
        ),
        loop=LoopClock(park_after=6),
    )

    with capture_logs() as logs:
        await node.run_until_parked()

    assert node.loop.waits == [10, 1, 2, 10, 1, 10]
    assert node.report.kinds() == [
        *("started", "progress", "finished", "started", "failed", "started", "failed"),
        *("started", "finished", "started", "failed", "started", "finished"),
    ]
    postponed = [(e["event"], e["log_level"]) for e in logs if "retry_in_s" in e]
    assert postponed == [("sync_postponed", "warning")] * 3  # inside the grace, yet a warning


async def test_sync_failing_with_a_permanent_error_waits_retry_max() -> None:
    error = RuntimeCallFailed("ListImages: rpc error: code = Unknown desc = storage corrupted")
    node = Node(
        crio=FlakyCrio(version_script=[error, error]),
        schedule=SyncSchedule(resync_interval_s=600, retry_initial_s=1, retry_max_s=30),
        loop=LoopClock(park_after=4),
    )

    with capture_logs() as logs:
        await node.run_until_parked()

    assert node.loop.waits == [30, 30, 600, 600]
    assert [e.reason for e in node.report.failures] == ["RuntimeCallFailed"] * 2
    assert node.report.failures[0] is error
    failed = [e for e in logs if e["event"] == "sync_failed"]
    assert [(e["log_level"], e["reason"]) for e in failed] == [("error", "RuntimeCallFailed")] * 2


async def test_resync_interval_is_honoured_when_nothing_happens() -> None:
    node = Node(
        image_set("apps", A),
        schedule=SyncSchedule(resync_interval_s=300),
        loop=LoopClock(park_after=4),
    )

    await node.run_until_parked()

    assert node.loop.waits == [300, 300, 300, 300]
    assert node.loop.kicked == [False, False, False]
    assert [t for kind, t in node.report.events if kind == "started"] == [0, 300, 600, 900]
    assert len(node.report.finished) == 4
    assert node.crio.pull_calls == [A]
    assert node.reloader.calls == 1


async def test_request_sync_wakes_the_loop_before_the_resync_interval() -> None:
    node = Node(image_set("apps", A), loop=LoopClock(auto=False))
    task = asyncio.create_task(node.reconciler.run())
    try:
        await until(node.loop.entered.is_set)
        assert node.loop.waits == [600]
        node.loop.now_s += 42  # time passes while the loop is idle
        node.use(image_set("apps", A), image_set("more", B))

        node.reconciler.request_sync()
        await until(lambda: len(node.report.finished) == 2 and node.loop.entered.is_set())

        assert node.loop.kicked == [True]
        assert [t for kind, t in node.report.events if kind == "started"] == [0, 42]
        assert by_name(node.report.finished[1])["more"].state == "Pinned"
        assert node.loop.waits == [600, 600]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_resync_pulls_again_an_image_the_runtime_lost() -> None:
    node = Node(image_set("apps", A), loop=LoopClock(auto=False))
    task = asyncio.create_task(node.reconciler.run())
    try:
        await until(node.loop.entered.is_set)
        await node.crio.remove_image(A)  # CRI-O wiped its store after a crash

        node.loop.elapse()
        await until(lambda: len(node.report.finished) == 2)

        assert node.loop.kicked == [False]
        assert [t for kind, t in node.report.events if kind == "started"] == [0, 600]
        assert node.crio.pull_calls == [A, A]
        assert by_name(node.report.finished[1])["apps"].state == "Pinned"
        assert node.crio.pinned_names() == {A: True}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_request_during_a_sync_is_not_lost() -> None:
    node = Node(image_set("apps", A), loop=LoopClock(park_after=3))

    async def pull_and_request(ref: str) -> None:
        node.reconciler.request_sync()  # e.g. a spec file changed while pulls ran

    node.crio.pull_handler = pull_and_request

    await node.run_until_parked()

    assert node.loop.kicked == [True, False]
    assert [t for kind, t in node.report.events if kind == "started"] == [0, 0, 600]


# ---------------------------------------------------------------- with the real Reporter
def reasons(doc: Mapping[str, Any]) -> tuple[str, str]:
    """The reasons of a status document's Ready and Degraded conditions."""
    by_type = {c["type"]: c["reason"] for c in doc["conditions"]}
    return by_type["Ready"], by_type["Degraded"]


@pytest.mark.parametrize(
    ("break_it", "reason"),
    [
        pytest.param(
            lambda node: node.crio.version_script.append(unreachable()),
            "RuntimeUnreachable",
            id="runtime-down",
        ),
        pytest.param(
            lambda node: setattr(node.reloader, "failures", 1),
            "RuntimeReloadFailed",
            id="reload-failed",
        ),
        pytest.param(
            lambda node: node.crio.version_script.append(
                RuntimeCallFailed("Version: rpc error: code = Internal")
            ),
            "RuntimeCallFailed",
            id="runtime-refused",
        ),
    ],
)
async def test_sync_that_could_not_run_is_published_with_its_own_reason(
    break_it: Callable[[Node], None], reason: str
) -> None:
    node = Node(image_set("apps", A), loop=LoopClock(park_after=2))
    line = RecordingLine()
    status_store = MemoryStore()
    node.reconciler.report = Reporter(line=line, store=status_store)
    break_it(node)

    await node.run_until_parked()

    published = [doc for name, doc in status_store.saves if name == "status"]
    failed = [doc for doc in published if "lastError" in doc]
    assert len(failed) == 1
    assert reasons(failed[0]) == (reason, reason)
    assert failed[0]["lastError"].startswith(f"{reason}: ")
    assert reasons(published[-1]) == ("AllPinned", "AsExpected")
    assert [text for text in line.lines if text.endswith(")")] == [
        next(text for text in line.lines if text.endswith(f" ({reason})"))
    ]
    assert line.lines[-1] == "pinned 1/1 images"


class FarManifests(FakeManifests):
    """Manifests from a registry ``round_trip_s`` away: each fetch moves the sync's clock."""

    def __init__(self, sizes: Mapping[str, int], loop: LoopClock, round_trip_s: float) -> None:
        super().__init__(sizes)
        self.loop = loop
        self.round_trip_s = round_trip_s

    async def image_layers(self, ref: str, credentials: RegistryCredentials | None) -> ImageLayers:
        self.loop.now_s += self.round_trip_s
        return await super().image_layers(ref, credentials)


@pytest.mark.parametrize(("round_trip_s", "in_flight"), [(0.0, 6), (0.002, 6), (0.05, 18)])
async def test_pulls_from_a_far_registry_run_three_times_as_many_at_once(
    round_trip_s: float, in_flight: int
) -> None:
    """``pull.concurrency`` (6) where the admission's manifest fetches come back fast; three
    times that where a round of them takes 60 ms or more (``prepull.pulls_in_flight``): the
    pulls then wait on round trips, not on the runtime's CPU."""
    refs = [f"quay.io/acme/app{i}@sha256:{i:064x}" for i in range(24)]
    node = Node(image_set("apps", *refs))
    node.admission.manifests = FarManifests(dict.fromkeys(refs, MIB), node.loop, round_trip_s)

    with capture_logs() as logs:
        status = await node.reconciler.sync()

    assert by_name(status)["apps"].state == "Pinned"
    assert node.crio.max_inflight == in_flight
    started = next(e for e in logs if e["event"] == "pulls_started")
    assert (started["images"], started["in_flight"]) == (24, in_flight)
