"""nodeagent.bundles.media: which udev events are bundle media, de-duplication, mount options.

The event sequences in the tracker tests are the ones systemd-udevd 252 sent
for loop devices on the test machine (see tests/testenv/udev.py).
"""

from __future__ import annotations

import pytest

from nodeagent.adapters.bundles.mount import (
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    split_options,
)
from nodeagent.bundles.media import (
    DEFAULT_BUSES,
    DEFAULT_FS_TYPES,
    KNOWN_FS_TYPES,
    MediaEvent,
    MediaKind,
    MediaTracker,
    classify,
    decode_udev_string,
    media_bus,
    mount_dir_name,
    mount_options,
)

PATTERN = "NODEAGENT*"
UUID = "d6da4a73-38fc-4847-bd4e-025d10200dee"


def props(action: str = "change", devname: str = "/dev/loop0", **extra: str) -> dict[str, str]:
    """A udev event of a block device; keyword arguments add or replace properties."""
    base = {"ACTION": action, "SUBSYSTEM": "block", "DEVTYPE": "disk", "DEVNAME": devname}
    return {**base, "SEQNUM": "847", "ID_BUS": "usb", **extra}


def fs(
    label: str = "NODEAGENT-1", fs_type: str = "ext4", uuid: str = UUID, **extra: str
) -> dict[str, str]:
    """The properties udev's blkid builtin adds for a filesystem."""
    found = {"ID_FS_USAGE": "filesystem", "ID_FS_TYPE": fs_type, "ID_FS_UUID": uuid}
    return {**found, "ID_FS_LABEL": label, "ID_FS_LABEL_ENC": label, **extra}


ARRIVALS = [
    pytest.param(props(**fs()), id="change-with-matching-ext4"),
    pytest.param(props("add", **fs()), id="add"),
    pytest.param(props(DEVTYPE="partition", DEVNAME="/dev/sdb1", **fs()), id="partition"),
    pytest.param(props(**fs("NODEAGENT")), id="label-equals-prefix"),
    pytest.param(props(**fs(fs_type="xfs")), id="xfs"),
    pytest.param(props(**fs(fs_type="iso9660", uuid="2026-11-22-09-30-00-00")), id="iso9660"),
    pytest.param(props(**fs(fs_type="squashfs", uuid="")), id="no-uuid"),
    pytest.param(props(**fs(fs_type="vfat", uuid="1234-ABCD")), id="vfat"),
]


@pytest.mark.parametrize("event", ARRIVALS)
def test_arrivals(event: dict[str, str]) -> None:
    media = classify(event, label_pattern=PATTERN, fs_types=KNOWN_FS_TYPES)
    assert media is not None
    assert media.kind is MediaKind.ARRIVED
    assert (media.devnode, media.label) == (event["DEVNAME"], event["ID_FS_LABEL"])
    assert (media.fs_type, media.uuid) == (event["ID_FS_TYPE"], event["ID_FS_UUID"])
    assert media.action == event["ACTION"]


def test_enumerated_device_without_action_counts_as_add() -> None:
    event = props(**fs())
    del event["ACTION"], event["SEQNUM"]
    media = classify(event, label_pattern=PATTERN)
    assert media is not None
    assert (media.kind, media.action, media.seqnum) == (MediaKind.ARRIVED, "add", None)


IRRELEVANT = [
    pytest.param(props(ID_BUS="", **fs("OTHER")), id="label-not-matching-on-a-loop"),
    pytest.param(props(ID_BUS="", **fs("XNODEAGENT")), id="glob-is-anchored"),
    pytest.param(props(ID_BUS="", **fs("")), id="no-label-on-a-loop"),
    pytest.param(props(devname="/dev/sda1", ID_BUS="ata", **fs("root")), id="the-node-s-own-disk"),
    pytest.param(props(devname="/dev/vda", ID_BUS="", **fs("boot")), id="virtio-disk"),
    pytest.param(props(), id="no-filesystem"),
    pytest.param(props(**fs(ID_FS_USAGE="crypto")), id="luks-usage"),
    pytest.param(props(**fs(ID_FS_USAGE="raid")), id="raid-member"),
    pytest.param(props(SUBSYSTEM="usb", **fs()), id="not-block"),
    pytest.param(props(DEVTYPE="usb_device", **fs()), id="not-disk-or-partition"),
    pytest.param(props(DEVNAME="", **fs()), id="no-devnode"),
    pytest.param(props("remove", **fs()), id="remove-untracked"),
    pytest.param(props("move", **fs()), id="move"),
    pytest.param(props("change", SYSTEMD_READY="0"), id="loop-detach-untracked"),
]


@pytest.mark.parametrize("event", IRRELEVANT)
def test_irrelevant(event: dict[str, str]) -> None:
    assert classify(event, label_pattern=PATTERN) is None


LABEL_REFUSALS = [
    pytest.param(props(**fs("OTHER")), "'OTHER' does not match", id="usb-stick-other-label"),
    pytest.param(props(**fs("")), "(no label) does not match", id="usb-stick-no-label"),
    pytest.param(props(**fs("nodeagent-1")), "case-sensitive", id="usb-case-differs"),
    pytest.param(props(ID_BUS="", **fs("nodeagent-1")), "case-sensitive", id="loop-case-differs"),
]


@pytest.mark.parametrize(("event", "said"), LABEL_REFUSALS)
def test_a_stick_whose_label_does_not_match_is_refused_saying_so(
    event: dict[str, str], said: str
) -> None:
    """It was ignored without a word: a technician saw nothing happen (issue 28)."""
    media = classify(event, label_pattern=PATTERN)
    assert media is not None and media.kind is MediaKind.REFUSED
    assert said in media.refusal and "[bundles] label_pattern 'NODEAGENT*'" in media.refusal


REMOVALS = [
    pytest.param(props("remove"), id="remove"),
    pytest.param(props("change", SYSTEMD_READY="0"), id="loop-detach"),
    pytest.param(props("change", DISK_MEDIA_CHANGE="1"), id="card-pulled"),
    pytest.param(props(ID_BUS="", **fs("OTHER")), id="relabelled"),
    pytest.param(props("add"), id="re-added-empty"),
]


@pytest.mark.parametrize("event", REMOVALS)
def test_removals_of_tracked_devices(event: dict[str, str]) -> None:
    media = classify(event, label_pattern=PATTERN, tracked={"/dev/loop0"})
    assert media is not None
    assert (media.kind, media.devnode, media.action) == (
        MediaKind.REMOVED,
        "/dev/loop0",
        event["ACTION"],
    )
    assert media.seqnum == 847


@pytest.mark.parametrize(
    ("label", "pattern", "expected"),
    [
        ("NODEAGENT-2026", "NODEAGENT*", True),
        ("nodeagent-2026", "NODEAGENT*", False),
        ("nodeagent-2026", "[Nn][Oo]*", True),
        ("LINE3_UPGRADE", "LINE?_UPGRADE", True),
        ("LINE10_UPGRADE", "LINE?_UPGRADE", False),
        ("anything", "*", True),
        ("", "*", False),
    ],
)
def test_label_glob(label: str, pattern: str, expected: bool) -> None:
    media = classify(props(**fs(label)), label_pattern=pattern)
    assert (media is not None and media.kind is MediaKind.ARRIVED) is expected


def test_label_is_decoded_from_the_escaped_form() -> None:
    event = props(**fs("NODEAGENT_line_3", ID_FS_LABEL_ENC="NODEAGENT\\x20line\\x203"))
    media = classify(event, label_pattern="NODEAGENT line *")
    assert media is not None
    assert media.label == "NODEAGENT line 3"


@pytest.mark.parametrize(
    ("encoded", "decoded"),
    [
        ("plain", "plain"),
        ("a\\x20b", "a b"),
        ("caf\\xc3\\xa9", "café"),
        ("slash\\x2fdot", "slash/dot"),
        ("bad\\xff", "bad\N{REPLACEMENT CHARACTER}"),
        ("not\\xzz", "not\\xzz"),
    ],
)
def test_decode_udev_string(encoded: str, decoded: str) -> None:
    assert decode_udev_string(encoded) == decoded


def test_allowed_fs_types_are_configurable() -> None:
    event = props(**fs(fs_type="ext4"))
    refused = classify(event, label_pattern=PATTERN, fs_types={"squashfs"})
    assert refused is not None and refused.kind is MediaKind.REFUSED
    allowed = classify(event, label_pattern=PATTERN, fs_types={"ext4"})
    assert allowed is not None and allowed.kind is MediaKind.ARRIVED


# ------------------------------------------------------------------ which media count


def test_the_defaults_are_ext4_and_vfat_on_usb() -> None:
    assert (sorted(DEFAULT_FS_TYPES), sorted(DEFAULT_BUSES)) == (["ext4", "vfat"], ["usb"])


@pytest.mark.parametrize(
    ("device", "bus"),
    [
        pytest.param({"ID_BUS": "usb", "DEVNAME": "/dev/sdb1"}, "usb", id="usb-stick"),
        pytest.param(  # a UAS SSD: usb_id still says usb; it has no removable flag
            {"ID_BUS": "usb", "ID_USB_DRIVER": "uas", "DEVNAME": "/dev/sdc"}, "usb", id="usb-ssd"
        ),
        pytest.param(
            {"ID_PATH": "pci-0000:00:14.0-usb-0:2:1.0-scsi-0:0:0:0", "DEVNAME": "/dev/sdd"},
            "usb",
            id="usb-by-path",
        ),
        pytest.param({"ID_BUS": "ata", "DEVNAME": "/dev/sda1"}, "ata", id="sata-disk"),
        pytest.param({"ID_BUS": "scsi", "DEVNAME": "/dev/sdb"}, "scsi", id="sas-disk"),
        pytest.param({"DEVNAME": "/dev/loop3"}, "loop", id="loop"),
        pytest.param({"DEVNAME": "/dev/mmcblk0p1"}, "mmc", id="sd-slot"),
        pytest.param({"DEVNAME": "/dev/nvme0n1p2"}, "nvme", id="nvme"),
        pytest.param({"DEVNAME": "/dev/vdb"}, "virtio", id="virtio"),
        pytest.param({"ID_BUS": "ieee1394", "DEVNAME": "/dev/sde"}, "unknown", id="firewire"),
        pytest.param({"DEVNAME": "/dev/nbd0"}, "unknown", id="nbd"),
        pytest.param({"DEVNAME": "/dev/sdf", "removable": "1"}, "unknown", id="removable-alone"),
    ],
)
def test_media_bus(device: dict[str, str], bus: str) -> None:
    assert media_bus(device) == bus


REFUSALS = [
    pytest.param(props(**fs(fs_type="ntfs")), "ntfs", "media_fs_types", id="ntfs"),
    pytest.param(props(**fs(fs_type="btrfs")), "btrfs", "media_fs_types", id="btrfs-by-default"),
    pytest.param(props(**fs(fs_type="xfs")), "xfs", "media_fs_types", id="xfs-by-default"),
    pytest.param(props(ID_BUS="", **fs()), "loop bus", "media_buses", id="loop-by-default"),
    pytest.param(
        props(devname="/dev/mmcblk0p1", ID_BUS="", **fs()),
        "mmc",
        "media_buses",
        id="sd-slot-by-default",
    ),
    pytest.param(
        props(devname="/dev/sda1", ID_BUS="ata", **fs()), "ata", "media_buses", id="internal-disk"
    ),
]


@pytest.mark.parametrize(("event", "named", "setting"), REFUSALS)
def test_labelled_media_not_allowed_are_refused_with_why(
    event: dict[str, str], named: str, setting: str
) -> None:
    media = classify(event, label_pattern=PATTERN)
    assert media is not None and media.kind is MediaKind.REFUSED
    assert named in media.refusal and f"[bundles] {setting}" in media.refusal
    assert (media.label, media.fs_type) == ("NODEAGENT-1", event["ID_FS_TYPE"])


def test_filesystem_is_judged_before_the_bus() -> None:
    media = classify(props(ID_BUS="", **fs(fs_type="btrfs")), label_pattern=PATTERN)
    assert media is not None and "media_fs_types" in media.refusal


def test_allowed_buses_are_configurable() -> None:
    loop = props(ID_BUS="", **fs())
    media = classify(loop, label_pattern=PATTERN, buses={"usb", "loop"})
    assert media is not None and (media.kind, media.bus) == (MediaKind.ARRIVED, "loop")


def test_refusal_text_is_clipped_and_escaped() -> None:
    media = classify(props(**fs(fs_type="\x1b[31m" + "z" * 100)), label_pattern=PATTERN)
    assert media is not None and "\x1b" not in media.refusal
    assert "\\x1b[31m" in media.refusal and len(media.refusal) < 300


# ------------------------------------------------------------------ tracker

ATTACHED = props(**fs(), DISKSEQ="31")
DETACH = [
    props(SEQNUM="859", SYSTEMD_READY="0"),
    props(SEQNUM="860", SYSTEMD_READY="0", DISK_MEDIA_CHANGE="1"),
]


def kinds(events: list[MediaEvent]) -> list[tuple[MediaKind, str]]:
    return [(event.kind, event.label) for event in events]


def run(tracker: MediaTracker, sequence: list[dict[str, str]]) -> list[MediaEvent]:
    return [event for props_ in sequence for event in tracker.feed(props_)]


def test_attach_then_detach_of_a_reused_loop_device() -> None:
    # losetup on loop0: two identical change events; losetup -d: two more without fs.
    events = run(MediaTracker(label_pattern=PATTERN), [ATTACHED, ATTACHED, *DETACH])
    assert kinds(events) == [
        (MediaKind.ARRIVED, "NODEAGENT-1"),
        (MediaKind.REMOVED, "NODEAGENT-1"),
    ]
    assert events[1].seqnum == 859
    assert events[1].uuid == UUID, "the removal tells which media left"


def test_fresh_loop_device_add_then_change_is_one_arrival() -> None:
    sequence = [props("add", DISKSEQ="33", **fs()), props("change", DISKSEQ="34", **fs())]
    assert kinds(run(MediaTracker(label_pattern=PATTERN), sequence)) == [
        (MediaKind.ARRIVED, "NODEAGENT-1")
    ]


def test_trigger_add_of_known_media_is_not_repeated() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    assert len(run(tracker, [ATTACHED])) == 1
    assert run(tracker, [props("add", **fs())]) == []


def test_empty_device_formatted_later_arrives_on_change() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    events = run(tracker, [props(), props(), props(**fs("NODEAGENT-LATE"))])
    assert kinds(events) == [(MediaKind.ARRIVED, "NODEAGENT-LATE")]
    assert events[0].action == "change"


def test_reformatted_with_other_bundle_media_is_removal_then_arrival() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    other = props(**fs("NODEAGENT-2", uuid="5f701d30-203b-4c0a-9fc8-ab062917fd8d"))
    assert kinds(run(tracker, [ATTACHED, other])) == [
        (MediaKind.ARRIVED, "NODEAGENT-1"),
        (MediaKind.REMOVED, "NODEAGENT-1"),
        (MediaKind.ARRIVED, "NODEAGENT-2"),
    ]
    assert tracker.present["/dev/loop0"].label == "NODEAGENT-2"


def test_relabelled_to_non_matching_is_a_removal() -> None:
    tracker = MediaTracker(label_pattern=PATTERN, buses={"usb", "loop"})
    loop = props(ID_BUS="", **fs("SCRATCH"))
    events = run(tracker, [props(ID_BUS="", **fs()), loop])
    assert kinds(events) == [(MediaKind.ARRIVED, "NODEAGENT-1"), (MediaKind.REMOVED, "NODEAGENT-1")]
    assert tracker.present == {}


def test_a_usb_stick_relabelled_to_non_matching_is_removed_then_refused_once() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    scratch = props(**fs("SCRATCH"))
    events = run(tracker, [ATTACHED, scratch, scratch])
    assert kinds(events) == [
        (MediaKind.ARRIVED, "NODEAGENT-1"),
        (MediaKind.REMOVED, "NODEAGENT-1"),
        (MediaKind.REFUSED, "SCRATCH"),
    ]


def test_usb_stick_partition_removed() -> None:
    part = {"DEVTYPE": "partition", "DEVNAME": "/dev/sdb1"}
    sequence = [props("add", **part, **fs()), props("remove", **part)]
    assert [e.kind for e in run(MediaTracker(label_pattern=PATTERN), sequence)] == [
        MediaKind.ARRIVED,
        MediaKind.REMOVED,
    ]


def test_two_devices_are_tracked_separately() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    run(tracker, [ATTACHED, props(devname="/dev/loop1", **fs("NODEAGENT-2", uuid="u2"))])
    assert sorted(tracker.present) == ["/dev/loop0", "/dev/loop1"]
    assert [e.devnode for e in run(tracker, DETACH)] == ["/dev/loop0"]
    assert sorted(tracker.present) == ["/dev/loop1"]


def test_reconcile_at_start_reports_present_media_once() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    enumerated = [props(**fs()), props(devname="/dev/vda", ID_BUS="", **fs("root", uuid="r"))]
    for device in enumerated:
        del device["ACTION"]
    assert kinds(tracker.reconcile(enumerated)) == [(MediaKind.ARRIVED, "NODEAGENT-1")]
    assert tracker.reconcile(enumerated) == []
    assert run(tracker, [ATTACHED]) == [], "a live event about known media is not repeated"


BTRFS = props(**fs(fs_type="btrfs"))


def test_a_refused_medium_is_reported_once_per_plug_in() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    events = run(tracker, [BTRFS, BTRFS, props("add", **fs(fs_type="btrfs"))])
    assert [e.kind for e in events] == [MediaKind.REFUSED]
    assert tracker.present == {}
    assert run(tracker, DETACH) == [], "nothing was tracked: nothing is removed"
    assert [e.kind for e in run(tracker, [BTRFS])] == [MediaKind.REFUSED], "plugged in again"


def test_refused_again_after_a_remove_event() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    events = run(tracker, [BTRFS, props("remove"), BTRFS])
    assert [e.kind for e in events] == [MediaKind.REFUSED, MediaKind.REFUSED]


def test_another_reason_on_the_same_device_is_reported() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    on_loop = props(ID_BUS="", **fs())
    assert [e.refusal[:14] for e in run(tracker, [BTRFS, on_loop])] == [
        "its filesystem",
        "it is on the l",
    ]


def test_tracked_media_reformatted_to_a_refused_filesystem_is_removed_then_refused() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    events = run(tracker, [ATTACHED, BTRFS])
    assert [(e.kind, e.fs_type) for e in events] == [
        (MediaKind.ARRIVED, "ext4"),
        (MediaKind.REMOVED, "ext4"),
        (MediaKind.REFUSED, "btrfs"),
    ]
    assert tracker.present == {}


def test_a_refused_device_that_becomes_allowed_arrives() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    assert [e.kind for e in run(tracker, [BTRFS, ATTACHED])] == [
        MediaKind.REFUSED,
        MediaKind.ARRIVED,
    ]


def test_reconcile_forgets_refused_devices_that_are_gone() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    run(tracker, [BTRFS])
    assert tracker.reconcile([]) == []
    assert [e.kind for e in run(tracker, [BTRFS])] == [MediaKind.REFUSED]


def test_reconcile_after_lost_events_removes_what_is_gone() -> None:
    tracker = MediaTracker(label_pattern=PATTERN)
    run(tracker, [ATTACHED, props(devname="/dev/loop1", **fs("NODEAGENT-2", uuid="u2"))])
    snapshot = [props("change", devname="/dev/loop1")]  # loop1 lost its fs; loop0 vanished
    events = tracker.reconcile(snapshot)
    assert sorted((e.kind, e.devnode) for e in events) == [
        (MediaKind.REMOVED, "/dev/loop0"),
        (MediaKind.REMOVED, "/dev/loop1"),
    ]
    assert tracker.present == {}


# ------------------------------------------------------------------ mounting


@pytest.mark.parametrize(
    ("fs_type", "options"),
    [
        ("ext4", "ro,nosuid,nodev,noexec,noload"),
        ("ext3", "ro,nosuid,nodev,noexec,noload"),
        ("ext2", "ro,nosuid,nodev,noexec"),
        ("xfs", "ro,nosuid,nodev,noexec,norecovery"),
        ("btrfs", "ro,nosuid,nodev,noexec,rescue=nologreplay"),
        ("squashfs", "ro,nosuid,nodev,noexec"),
        ("erofs", "ro,nosuid,nodev,noexec"),
        ("vfat", "ro,nosuid,nodev,noexec"),
        ("iso9660", "ro,nosuid,nodev,noexec"),
        ("unknown", "ro,nosuid,nodev,noexec"),
    ],
)
def test_R28_mount_options(fs_type: str, options: str) -> None:
    assert mount_options(fs_type) == options


@pytest.mark.parametrize(
    ("options", "flags", "data"),
    [
        ("ro,nosuid,nodev,noexec", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, ""),
        ("ro,nosuid,nodev,noexec,noload", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "noload"),
        ("ro,rescue=nologreplay,,x=1", MS_RDONLY, "rescue=nologreplay,x=1"),
    ],
)
def test_split_options(options: str, flags: int, data: str) -> None:
    assert split_options(options) == (flags, data)


def arrival(label: str, uuid: str = "", devnode: str = "/dev/sdb1") -> MediaEvent:
    return MediaEvent(MediaKind.ARRIVED, devnode, label, "ext4", uuid, "add")


@pytest.mark.parametrize(
    ("event", "name"),
    [
        (arrival("NODEAGENT-1", UUID), f"NODEAGENT-1-{UUID}"),
        (arrival("NODEAGENT-1"), "NODEAGENT-1-sdb1"),
        (arrival("../../etc", "x"), "_.._etc-x"),
        (arrival("NODEAGENT line/3", "u"), "NODEAGENT_line_3-u"),
        (arrival("..", "", "/dev/loop0"), "-loop0"),
        (arrival("X" * 300, "u"), "X" * 120),
    ],
)
def test_mount_dir_name(event: MediaEvent, name: str) -> None:
    assert mount_dir_name(event) == name
    assert "/" not in name and not name.startswith(".")


@pytest.mark.parametrize(
    ("extra", "is_marked"),
    [({"NODEAGENT_MEDIA": "1"}, True), ({}, False), ({"NODEAGENT_MEDIA": "0"}, False)],
)
def test_arrival_says_whether_the_packages_udev_rule_marked_it(
    extra: dict[str, str], is_marked: bool
) -> None:
    media = classify(props(**fs(**extra)), label_pattern=PATTERN)
    assert media is not None
    assert media.is_rule_marked is is_marked
