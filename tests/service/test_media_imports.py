"""MediaImports: udev events in, one guarded import task per medium, reports out.

Real: ``MediaImports`` and the daemon's ``Supervisor.spawn``. Fake: the udev source (events
the test feeds), the mounter, and the importer (``ScriptedImporter``: each import waits
until the test releases it). asyncio's exception handler is replaced by a recorder for
every test, so a task whose failure nobody retrieved fails the test.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from structlog.testing import capture_logs

from nodeagent.bundles.imports import MediaImports
from nodeagent.bundles.media import MediaEvent, MediaKind, mount_dir_name
from nodeagent.daemon.supervisor import Supervisor
from nodeagent.errors import MediaMountFailed, MediaUnmountFailed
from nodeagent.status import BundleReport, BundleState
from tests.fakes.ports import FakeMounter, QueueSource, ScriptedImporter, until

if TYPE_CHECKING:
    from nodeagent.bundles.importer import Importer

SDB1 = "/dev/sdb1"
SDC1 = "/dev/sdc1"


def arrived(
    devnode: str = SDB1, *, label: str = "NODEAGENT", uuid: str = "1234-ABCD"
) -> MediaEvent:
    return MediaEvent(MediaKind.ARRIVED, devnode, label, "vfat", uuid, "add")


def removed(devnode: str = SDB1) -> MediaEvent:
    return MediaEvent(MediaKind.REMOVED, devnode, "NODEAGENT", "vfat", "1234-ABCD", "remove")


@pytest.fixture(autouse=True)
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reached asyncio's exception handler during the test (must stay empty)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        yield errors
        gc.collect()  # a task dropped with its exception unretrieved reports it when collected
        assert errors == []
    finally:
        loop.set_exception_handler(previous)


class Rig:
    def __init__(
        self, media_dir: Path, *, state: BundleState = "imported", is_stored_first: bool = False
    ) -> None:
        self.state: BundleState = state
        self.is_stored_first = is_stored_first
        self.supervisor = Supervisor()
        self.mounter = FakeMounter()
        self.source = QueueSource()
        self.reports: list[BundleReport] = []
        self.importers: list[ScriptedImporter] = []
        self.imported = 0
        self.media = MediaImports(
            media_dir=media_dir,
            make_importer=self._make_importer,
            mount=self.mounter,
            spawn=self.supervisor.spawn,
            report=self.reports.append,
            on_imported=self._on_imported,
        )
        self._follow: asyncio.Task[None] | None = None

    def _make_importer(
        self, is_present: Callable[[Path], bool], release: Callable[[Path], None]
    ) -> Importer:
        importer = ScriptedImporter(
            is_present,
            state=self.state,
            release_medium=release,
            is_stored_first=self.is_stored_first,
        )
        self.importers.append(importer)
        return cast("Importer", importer)

    def _on_imported(self) -> None:
        self.imported += 1

    @property
    def importer(self) -> ScriptedImporter:
        assert len(self.importers) == 1
        return self.importers[0]

    def start(self) -> None:
        self._follow = asyncio.create_task(self.media.follow(self.source))

    async def stop(self) -> None:
        self.source.close()
        assert self._follow is not None
        await asyncio.wait_for(self._follow, 5)
        await self.supervisor.cancel_spawned()

    async def fed(self, *events: MediaEvent) -> None:
        """Feed events and wait until ``MediaImports`` has handled every one."""
        target = self.source.handled + len(events)
        self.source.feed(*events)
        await until(lambda: self.source.handled == target)

    async def idle(self) -> None:
        """Wait until no import task is left."""
        await until(lambda: not self.media.tasks)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    rig = Rig(tmp_path / "media")
    rig.start()
    yield rig
    await rig.stop()


async def test_arrival_is_mounted_imported_unmounted_and_announced(
    rig: Rig, tmp_path: Path
) -> None:
    event = arrived()
    target = tmp_path / "media" / mount_dir_name(event)

    await rig.fed(event)
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)
    assert rig.media.is_present(target) is True
    rig.importer.release.set()
    await rig.idle()

    call = rig.importer.calls[0]
    assert (call.root, call.source, call.was_present, call.outcome) == (
        target,
        SDB1,
        True,
        "returned",
    )
    assert rig.mounter.calls == [(SDB1, "vfat", target)]
    assert rig.mounter.mounted[0].unmounts == [True]  # lazily: a stick may be gone already
    assert rig.imported == 1
    assert rig.reports == []  # the importer reports its own steps
    assert rig.media.roots == {}
    assert rig.media.is_present(target) is False


@pytest.mark.parametrize(("state", "announced"), [("imported", 1), ("rejected", 0)])
async def test_only_an_imported_bundle_triggers_a_sync(
    tmp_path: Path, state: BundleState, announced: int
) -> None:
    rig = Rig(tmp_path / "media", state=state)
    rig.start()
    try:
        await rig.fed(arrived())
        await until(lambda: bool(rig.importers))
        rig.importer.release.set()
        await rig.idle()
        assert rig.importer.outcomes() == ["returned"]
        assert rig.imported == announced
    finally:
        await rig.stop()


async def test_second_arrival_while_importing_starts_nothing_new(rig: Rig) -> None:
    await rig.fed(arrived())
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)

    await rig.fed(MediaEvent(MediaKind.ARRIVED, SDB1, "NODEAGENT", "vfat", "1234-ABCD", "change"))

    assert len(rig.media.tasks) == 1
    assert len(rig.importer.calls) == 1
    assert len(rig.mounter.calls) == 1
    rig.importer.release.set()
    await rig.idle()
    assert rig.importer.outcomes() == ["returned"]
    assert rig.imported == 1

    await rig.fed(arrived())  # plugged in again once the import is over: imported again
    await until(lambda: len(rig.importer.calls) == 2)
    await rig.idle()
    assert rig.imported == 2
    assert len(rig.importers) == 1  # the importer is built once, on the first medium


async def test_removal_cancels_the_running_import_and_reports_it_interrupted(
    rig: Rig, tmp_path: Path
) -> None:
    event = arrived()
    target = tmp_path / "media" / mount_dir_name(event)
    await rig.fed(event)
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)

    await rig.fed(removed())
    await rig.idle()

    assert rig.importer.outcomes() == ["cancelled"]
    assert [(r.source, r.state, r.reason) for r in rig.reports] == [
        (SDB1, "interrupted", "BundleMediaRemoved")
    ]
    assert rig.reports[0].message is not None
    assert rig.reports[0].message.startswith(
        f"{SDB1} (NODEAGENT) was removed during the import; the images already in the runtime"
    )
    assert rig.mounter.mounted[0].unmounts == [True]
    assert rig.imported == 0
    assert rig.media.is_present(target) is False
    assert SDB1 not in rig.media.present


async def test_an_import_stopped_with_the_daemon_is_not_reported_as_a_removed_medium(
    rig: Rig,
) -> None:
    await rig.fed(arrived())
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)

    with capture_logs() as logs:
        await rig.supervisor.cancel_spawned()  # what SIGTERM does to the spawned imports

    assert rig.importer.outcomes() == ["cancelled"]
    assert rig.reports == []  # not "interrupted: the medium was removed"
    assert [e["event"] for e in logs if e["event"].startswith("bundle_")] == [
        "bundle_import_stopped"
    ]
    assert rig.mounter.mounted[0].unmounts == [True]


async def test_removal_of_a_medium_waiting_for_another_import_reports_nothing(rig: Rig) -> None:
    await rig.fed(arrived(SDB1), arrived(SDC1, uuid="5678-EF01"))
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)

    await rig.fed(removed(SDC1))
    await until(lambda: SDC1 not in rig.media.tasks)
    rig.importer.release.set()
    await rig.idle()

    assert [call.source for call in rig.importer.calls] == [SDB1]
    assert [devnode for devnode, _, _ in rig.mounter.calls] == [SDB1]  # SDC1 never mounted
    assert rig.reports == []
    assert rig.imported == 1


async def test_media_are_imported_one_at_a_time(rig: Rig) -> None:
    await rig.fed(arrived(SDB1), arrived(SDC1, uuid="5678-EF01"))
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)

    assert set(rig.media.tasks) == {SDB1, SDC1}
    assert [devnode for devnode, _, _ in rig.mounter.calls] == [SDB1]
    rig.importer.release.set()
    await rig.idle()

    assert [call.source for call in rig.importer.calls] == [SDB1, SDC1]
    assert rig.importer.outcomes() == ["returned", "returned"]
    assert rig.imported == 2


async def test_mount_failure_becomes_a_rejected_report_and_the_next_plug_in_imports(
    rig: Rig, loop_errors: list[dict[str, Any]]
) -> None:
    failure = MediaMountFailed(f"mount {SDB1}: the device holds no valid filesystem of this type")
    rig.mounter.errors[SDB1] = failure

    await rig.fed(arrived())
    await rig.idle()
    gc.collect()

    assert rig.reports == [
        BundleReport(SDB1, "rejected", reason="MediaMountFailed", message=failure.message)
    ]
    assert rig.importers == []  # never built: nothing was mounted
    assert rig.imported == 0
    assert loop_errors == []

    await rig.fed(arrived())
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)
    rig.importer.release.set()
    await rig.idle()
    assert rig.imported == 1


async def test_media_present_at_start_are_imported(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "media")
    rig.source = QueueSource(existing=[arrived()])
    rig.start()
    try:
        await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)
        rig.importer.release.set()
        await rig.idle()
        assert rig.imported == 1
        assert rig.source.handled == 0
    finally:
        await rig.stop()


async def test_medium_swapped_during_an_import_is_imported(rig: Rig) -> None:
    """udev's tracker reports a re-formatted or swapped medium as a removal then an arrival,
    back to back: the new medium must be imported once the old import has given up."""
    await rig.fed(arrived(uuid="1234-ABCD"))
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)

    await rig.fed(removed(), arrived(uuid="9999-0000"))
    await until(lambda: len(rig.importer.calls) == 2)
    rig.importer.release.set()
    await rig.idle()

    assert rig.importer.outcomes() == ["cancelled", "returned"]
    assert [call.root.name for call in rig.importer.calls] == [
        "NODEAGENT-1234-ABCD",
        "NODEAGENT-9999-0000",
    ]
    assert [r.state for r in rig.reports] == ["interrupted"]
    assert rig.imported == 1
    assert rig.media.tasks == {}


async def test_plugged_in_again_while_the_interrupted_import_unwinds_is_imported(rig: Rig) -> None:
    """The real importer removes its mirror (a runtime reload, seconds) before it gives up."""
    await rig.fed(arrived())
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)
    rig.importer.cleanup.clear()

    await rig.fed(removed())
    await until(lambda: rig.importer.outcomes() == ["cancelled"])
    await rig.fed(arrived())
    rig.importer.cleanup.set()
    await until(lambda: len(rig.importer.calls) == 2)
    rig.importer.release.set()
    await rig.idle()

    assert rig.importer.outcomes() == ["cancelled", "returned"]
    assert rig.importer.calls[1].was_present is True
    assert len(rig.mounter.calls) == 2
    assert rig.mounter.mounted[0].unmounts == [True]
    assert rig.imported == 1


async def test_medium_removed_while_it_is_being_mounted_is_unmounted(rig: Rig) -> None:
    """mount(2) runs in a thread that a cancellation cannot stop: left mounted, the mount
    point would refuse the next plug-in of the same stick."""
    rig.mounter.gate.clear()
    try:
        await rig.fed(arrived())
        await until(lambda: len(rig.mounter.calls) == 1)

        await rig.fed(removed())
    finally:
        rig.mounter.gate.set()
    await rig.idle()
    await until(lambda: len(rig.mounter.mounted) == 1)

    await until(lambda: rig.mounter.mounted[0].unmounts == [True])
    assert rig.importers == []
    assert rig.imported == 0


@pytest.fixture
async def storing_rig(tmp_path: Path) -> AsyncIterator[Rig]:
    rig = Rig(tmp_path / "media", is_stored_first=True)
    rig.start()
    yield rig
    await rig.stop()


async def test_removal_after_the_bundle_is_stored_does_not_stop_its_import(
    storing_rig: Rig,
) -> None:
    """The status said the medium may be removed: the import runs from the node's store."""
    rig = storing_rig
    await rig.fed(arrived())
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)

    await rig.fed(removed())
    rig.importer.release.set()
    await rig.idle()

    assert rig.importer.outcomes() == ["returned"]
    assert rig.reports == []  # no "interrupted"
    assert rig.imported == 1
    assert rig.media.tasks == {}
    assert rig.media.released == set()


async def test_plugged_in_again_while_a_stored_bundle_imports_is_imported_after_it(
    storing_rig: Rig,
) -> None:
    rig = storing_rig
    await rig.fed(arrived())
    await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)
    first = rig.media.tasks[SDB1]
    await rig.fed(arrived())  # udev saying it again while present: nothing new
    assert rig.media.tasks[SDB1] is first
    await rig.fed(removed(), arrived())  # out and in again: a new medium
    assert rig.media.tasks[SDB1] is not first
    rig.importer.release.set()
    await until(lambda: len(rig.importer.calls) == 2)
    await rig.idle()

    assert rig.importer.outcomes() == ["returned", "returned"]
    assert rig.imported == 2
    assert rig.media.tasks == {}


async def test_a_refused_medium_is_never_mounted_and_is_reported_once(rig: Rig) -> None:
    why = "its filesystem btrfs is not one nodeagent mounts ([bundles] media_fs_types: ext4)"
    event = MediaEvent(
        MediaKind.REFUSED, SDC1, "NODEAGENT\x1b[2J", "btrfs", "u", "add", bus="usb", refusal=why
    )
    with capture_logs() as logs:
        await rig.fed(event)
    assert rig.mounter.calls == []
    assert rig.media.tasks == {} and rig.importers == []
    refused = [entry for entry in logs if entry["event"] == "bundle_media_refused"]
    assert len(refused) == 1 and refused[0]["log_level"] == "warning"
    assert (refused[0]["device"], refused[0]["fs"], refused[0]["bus"]) == (SDC1, "btrfs", "usb")
    assert "\x1b" not in refused[0]["label"] and "\x1b" not in refused[0]["error"]
    [report] = rig.reports
    assert (report.source, report.state, report.reason) == (SDC1, "rejected", "BundleMediaRefused")
    assert report.message is not None and why in report.message


async def test_a_mount_that_stays_after_the_import_is_said_in_the_journal(rig: Rig) -> None:
    """A medium whose mount cannot be detached (its mount point in use) was passed over in
    silence; the next plug-in then found the mount point busy. Now it is an error line."""
    rig.mounter.unmount_error = MediaUnmountFailed("cannot unmount /x: Device or resource busy")
    with capture_logs() as logs:
        await rig.fed(arrived())
        await until(lambda: len(rig.importers) == 1 and len(rig.importer.calls) == 1)
        rig.importer.release.set()
        await rig.idle()
    said = [e for e in logs if e["event"] == "media_not_unmounted"]
    assert [(e["log_level"], e["reason"], e["device"]) for e in said] == [
        ("error", "MediaUnmountFailed", SDB1)
    ]
    assert "busy" in said[0]["error"]
    assert rig.imported == 1  # the images imported stay imported
