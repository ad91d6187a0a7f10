"""Bundle media against the real peers: systemd-udevd, loop devices, mount(2).

The watcher tests run a real udev daemon (tests/testenv/udev.py) and attach
filesystem images to loop devices. Every wait has a deadline (asyncio.wait_for,
or a condition on udev's database); none sleeps. A test that asserts media is
IGNORED lets udev process that media first (its label is in udev's database),
then attaches a matching marker: events reach the watcher's socket in order, so
when the marker arrives, anything about the ignored media would have come first.
"""

from __future__ import annotations

import asyncio
import errno
import stat
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from nodeagent.adapters.bundles.mount import (
    MediaMountFailed,
    MediaUnmountFailed,
    mount_readonly,
    unmount,
)
from nodeagent.adapters.bundles.udev import MediaWatcher
from nodeagent.bundles.media import MediaEvent, MediaKind
from tests.testenv.udev import TEST_MEDIA_BUSES, FileSpec, LoopMedia, Udevd, settle

pytestmark = [
    pytest.mark.integration,
    pytest.mark.needs("root"),
]

DEADLINE_S = 10.0
PATTERN = "NODEAGENT*"
SCRIPT = b"#!/bin/sh\necho executed\n"
FILES = {"hello.txt": (b"hello\n", 0o644), "run.sh": (SCRIPT, 0o755)}

MakeMedia = Callable[..., LoopMedia]


@pytest.fixture(scope="module")
def udevd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Udevd]:
    with Udevd(tmp_path_factory.mktemp("udevd")) as daemon:
        yield daemon


@pytest.fixture
def make_media(tmp_path: Path) -> Iterator[MakeMedia]:
    """``make_media(fs_type, label=..., files=...)``: images detached and deleted at the end."""
    with ExitStack() as stack:

        def make(
            fs_type: str = "ext4", *, label: str = "", files: FileSpec | None = None
        ) -> LoopMedia:
            media = LoopMedia.create(tmp_path / "images", fs_type, label=label, files=files)
            return stack.enter_context(media)

        yield make
        unmount_all_below(tmp_path)  # even when the code under test left a mount behind


def unmount_all_below(root: Path) -> None:
    for target in sorted(mount_points(), reverse=True):
        if target.is_relative_to(root):
            subprocess.run(["umount", "--lazy", str(target)], check=False)


def mount_points() -> list[Path]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [Path(line.split()[4]) for line in lines]


async def next_for(
    watcher: MediaWatcher, devnode: str, seen: list[MediaEvent] | None = None
) -> MediaEvent:
    """The watcher's next event about ``devnode``; every event on the way goes to ``seen``."""

    async def first() -> MediaEvent:
        async for event in watcher:
            if seen is not None:
                seen.append(event)
            if event.devnode == devnode:
                return event
        raise AssertionError("the watcher ended")

    return await asyncio.wait_for(first(), DEADLINE_S)


# ------------------------------------------------------------------ watching


async def test_labelled_ext4_arrives(udevd: Udevd, make_media: MakeMedia) -> None:
    media = make_media("ext4", label="NODEAGENT-ARR")
    async with MediaWatcher(PATTERN, buses=TEST_MEDIA_BUSES) as watcher:
        devnode = media.attach()
        event = await next_for(watcher, devnode)
    assert (event.kind, event.label, event.fs_type) == (MediaKind.ARRIVED, "NODEAGENT-ARR", "ext4")
    assert event.action in ("add", "change")
    assert event.uuid and event.seqnum is not None


async def test_non_matching_label_is_ignored(udevd: Udevd, make_media: MakeMedia) -> None:
    other, marker = make_media(label="OTHER-MEDIA"), make_media(label="NODEAGENT-MARK")
    seen: list[MediaEvent] = []
    async with MediaWatcher(PATTERN, buses=TEST_MEDIA_BUSES) as watcher:
        other_devnode = other.attach()
        other.wait_in_udev_db("ID_FS_LABEL", "OTHER-MEDIA")
        await next_for(watcher, marker.attach(), seen)
    assert [e for e in seen if e.devnode == other_devnode] == []


async def test_filesystem_type_not_allowed_is_refused_once(
    udevd: Udevd, make_media: MakeMedia
) -> None:
    btrfs, marker = make_media("btrfs", label="NODEAGENT-BTR"), make_media(label="NODEAGENT-MARK")
    seen: list[MediaEvent] = []
    async with MediaWatcher(PATTERN, fs_types={"ext4"}, buses=TEST_MEDIA_BUSES) as watcher:
        btrfs_devnode = btrfs.attach()
        btrfs.wait_in_udev_db("ID_FS_TYPE", "btrfs")
        btrfs.trigger_add()  # one more event about the same medium: not reported again
        settle()
        await next_for(watcher, marker.attach(), seen)
        assert btrfs_devnode not in watcher.present
    refused = [e for e in seen if e.devnode == btrfs_devnode]
    assert [(e.kind, e.fs_type, e.bus) for e in refused] == [(MediaKind.REFUSED, "btrfs", "loop")]
    assert "btrfs" in refused[0].refusal and "media_fs_types" in refused[0].refusal


async def test_loop_device_is_refused_by_the_default_buses(
    udevd: Udevd, make_media: MakeMedia
) -> None:
    media = make_media(label="NODEAGENT-BUS")
    async with MediaWatcher(PATTERN) as watcher:
        devnode = media.attach()
        event = await next_for(watcher, devnode)
        assert devnode not in watcher.present
    assert (event.kind, event.bus, event.fs_type) == (MediaKind.REFUSED, "loop", "ext4")
    assert "media_buses: usb" in event.refusal


async def test_detach_is_a_removal(udevd: Udevd, make_media: MakeMedia) -> None:
    media = make_media(label="NODEAGENT-DET")
    async with MediaWatcher(PATTERN, buses=TEST_MEDIA_BUSES) as watcher:
        devnode = media.attach()
        arrived = await next_for(watcher, devnode)
        media.detach()
        removed = await next_for(watcher, devnode)
        assert devnode not in watcher.present
    assert removed.kind is MediaKind.REMOVED
    assert (removed.label, removed.uuid) == (arrived.label, arrived.uuid)


async def test_media_present_before_start_are_found_by_existing(
    udevd: Udevd, make_media: MakeMedia
) -> None:
    media, other = make_media(label="NODEAGENT-OLD"), make_media(label="OTHER-OLD")
    devnode, other_devnode = media.attach(), other.attach()
    media.wait_in_udev_db("ID_FS_LABEL", "NODEAGENT-OLD")
    other.wait_in_udev_db("ID_FS_LABEL", "OTHER-OLD")
    async with MediaWatcher(PATTERN, buses=TEST_MEDIA_BUSES) as watcher:
        found = {event.devnode: event for event in watcher.existing()}
        media.detach()
        removed = await next_for(watcher, devnode)
    assert found[devnode].kind is MediaKind.ARRIVED
    assert (found[devnode].label, found[devnode].action) == ("NODEAGENT-OLD", "add")
    assert other_devnode not in found
    assert (removed.kind, removed.label) == (MediaKind.REMOVED, "NODEAGENT-OLD")


async def test_known_media_is_not_reported_again(udevd: Udevd, make_media: MakeMedia) -> None:
    media, marker = make_media(label="NODEAGENT-KNOWN"), make_media(label="NODEAGENT-MARK")
    devnode = media.attach()
    media.wait_in_udev_db("ID_FS_LABEL", "NODEAGENT-KNOWN")
    seen: list[MediaEvent] = []
    async with MediaWatcher(PATTERN, buses=TEST_MEDIA_BUSES) as watcher:
        assert devnode in {event.devnode for event in watcher.existing()}
        media.trigger_add()
        settle()
        await next_for(watcher, marker.attach(), seen)
    assert [e for e in seen if e.devnode == devnode] == []


async def test_trigger_add_is_an_arrival(udevd: Udevd, make_media: MakeMedia) -> None:
    media = make_media(label="NODEAGENT-TRIG")
    devnode = media.attach()
    media.wait_in_udev_db("ID_FS_LABEL", "NODEAGENT-TRIG")
    async with MediaWatcher(PATTERN, buses=TEST_MEDIA_BUSES) as watcher:
        media.trigger_add()
        event = await next_for(watcher, devnode)
    assert (event.kind, event.action, event.label) == (MediaKind.ARRIVED, "add", "NODEAGENT-TRIG")


async def test_device_formatted_after_attach_arrives_on_change(
    udevd: Udevd, make_media: MakeMedia
) -> None:
    media = make_media("empty")
    async with MediaWatcher(PATTERN, buses=TEST_MEDIA_BUSES) as watcher:
        devnode = media.attach()
        settle()
        media.format("ext4", label="NODEAGENT-LATE")
        late = await next_for(watcher, devnode)
        media.format("ext4", label="NODEAGENT-NEW")
        replaced, new = await next_for(watcher, devnode), await next_for(watcher, devnode)
        media.format("ext4", label="SCRATCH")
        scratched = await next_for(watcher, devnode)
    assert (late.kind, late.action, late.label) == (MediaKind.ARRIVED, "change", "NODEAGENT-LATE")
    assert (replaced.kind, replaced.label) == (MediaKind.REMOVED, "NODEAGENT-LATE")
    assert (new.kind, new.label) == (MediaKind.ARRIVED, "NODEAGENT-NEW")
    assert (scratched.kind, scratched.label) == (MediaKind.REMOVED, "NODEAGENT-NEW")


async def test_lost_events_are_recovered_by_enumerating(
    udevd: Udevd, make_media: MakeMedia
) -> None:
    """The event loop is blocked while the devices change: the tiny buffer overflows."""
    first, second = make_media(label="NODEAGENT-LOST1"), make_media(label="NODEAGENT-LOST2")
    marker = make_media(label="NODEAGENT-MARK")
    # receive_buffer_bytes=1: the kernel's minimum
    async with MediaWatcher(PATTERN, buses=TEST_MEDIA_BUSES, receive_buffer_bytes=1) as watcher:
        first.attach()
        first.detach()
        second_devnode = second.attach()
        for _ in range(5):
            second.trigger_add()
        settle()
        await next_for(watcher, marker.attach())
        present = {devnode: event.label for devnode, event in watcher.present.items()}
    assert watcher.resync_count >= 1, "the buffer did not overflow: the test proves nothing"
    assert present.get(second_devnode) == "NODEAGENT-LOST2"
    assert "NODEAGENT-LOST1" not in present.values()


async def test_closing_ends_the_iteration(udevd: Udevd) -> None:
    watcher = MediaWatcher(PATTERN, buses=TEST_MEDIA_BUSES)
    async with watcher:
        pass
    assert await asyncio.wait_for(anext(watcher, None), DEADLINE_S) is None


# ------------------------------------------------------------------ mounting


def mountinfo(target: Path) -> tuple[set[str], set[str]] | None:
    """(per-mount options, superblock options) of the mount on ``target``, or None."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(target):
            separator = fields.index("-")
            return set(fields[5].split(",")), set(fields[separator + 3].split(","))
    return None


@pytest.mark.parametrize(
    ("fs_type", "super_option"),
    [
        ("ext4", "norecovery"),  # how ext4 shows noload
        ("xfs", "norecovery"),
        ("btrfs", "rescue=nologreplay"),
        ("squashfs", "ro"),
        ("erofs", "ro"),
    ],
)
def test_mount_readonly(
    tmp_path: Path, make_media: MakeMedia, fs_type: str, super_option: str
) -> None:
    media = make_media(fs_type, label="NODEAGENT-X", files=FILES)
    target = tmp_path / "media" / "NODEAGENT-X"
    mount = mount_readonly(media.attach(), fs_type, target)
    try:
        info = mountinfo(target)
        assert info is not None
        assert {"ro", "nosuid", "nodev", "noexec"} <= info[0]
        assert super_option in info[1]
        with pytest.raises(OSError, match="Read-only") as raised:
            (target / "new-file").write_bytes(b"x")
        assert raised.value.errno == errno.EROFS
        assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    finally:
        mount.unmount()
    assert mountinfo(target) is None
    assert not target.exists()


def test_noexec_and_content(tmp_path: Path, make_media: MakeMedia) -> None:
    media = make_media("ext4", label="NODEAGENT-EXEC", files=FILES)
    with mount_readonly(media.attach(), "ext4", tmp_path / "media" / "x") as mount:
        script = mount.target / "run.sh"
        assert (mount.target / "hello.txt").read_bytes() == b"hello\n"
        assert script.read_bytes() == SCRIPT
        assert script.stat().st_mode & 0o111 == 0o111, "the file itself is executable"
        with pytest.raises(PermissionError):
            subprocess.run([str(script)], check=False)
    assert mountinfo(mount.target) is None


def test_refuses_a_non_empty_mount_point(tmp_path: Path, make_media: MakeMedia) -> None:
    media = make_media("ext4", label="NODEAGENT-FULL")
    target = tmp_path / "media" / "taken"
    target.mkdir(parents=True)
    (target / "something").write_text("here first")
    with pytest.raises(MediaMountFailed, match="not empty") as raised:
        mount_readonly(media.attach(), "ext4", target)
    assert raised.value.reason == "MediaMountFailed"
    assert mountinfo(target) is None
    assert (target / "something").exists()


def test_wrong_filesystem_type_fails_and_cleans_up(tmp_path: Path, make_media: MakeMedia) -> None:
    media = make_media("ext4", label="NODEAGENT-WRONG")
    target = tmp_path / "media" / "wrong"
    with pytest.raises(MediaMountFailed, match="Invalid argument"):
        mount_readonly(media.attach(), "xfs", target)
    assert not target.exists()


def test_missing_device_fails(tmp_path: Path) -> None:
    with pytest.raises(MediaMountFailed, match="pulled out"):
        mount_readonly("/dev/nodeagent-no-such-device", "ext4", tmp_path / "media" / "gone")


def test_busy_unmount_fails_then_lazy_unmount_works(tmp_path: Path, make_media: MakeMedia) -> None:
    media = make_media("ext4", label="NODEAGENT-BUSY", files=FILES)
    mount = mount_readonly(media.attach(), "ext4", tmp_path / "media" / "busy")
    with (mount.target / "hello.txt").open("rb") as still_open:
        with pytest.raises(MediaUnmountFailed, match="still open") as raised:
            mount.unmount()
        assert raised.value.retry_after_s > 0
        assert mountinfo(mount.target) is not None
        unmount(mount.target, lazy=True)
        assert mountinfo(mount.target) is None
        assert still_open.read() == b"hello\n", "open files stay readable after a lazy unmount"
    assert not mount.target.exists()
