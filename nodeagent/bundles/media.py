"""Removable media that may carry an upgrade bundle: which udev events matter, and how to mount.

Pure decisions, no I/O: the udev adapter (``nodeagent.adapters.bundles.udev``) feeds the
properties of every block-device event (and of every block device present at
start) through ``MediaTracker``, which yields each arrival and removal once.

Rules, decided here and nowhere else:

* **Bundle media** is a block device (``SUBSYSTEM=block``, ``DEVTYPE`` disk or
  partition) whose udev blkid probe found a filesystem (``ID_FS_USAGE=filesystem``)
  with a label matching the configured glob, of an allowed type (``ID_FS_TYPE`` in
  ``[bundles] media_fs_types``, default ext4 and vfat) on an allowed bus (``media_bus``
  in ``[bundles] media_buses``, default usb). Everything is decided from the
  properties udev already holds, BEFORE anything is mounted: the kernel parses a
  filesystem only when it is mounted (udev's blkid probe reads the superblock in user
  space), so a crafted filesystem of a type that is not allowed, or on a device that is
  not, never reaches the kernel's filesystem code (docs/decisions/0054-which-media-count.md).
* **The bus** (``media_bus``) is where the device sits, as udev's builtins read it from
  the kernel's device tree, never from the medium: ``usb`` when ``ID_BUS=usb`` (usb_id:
  sticks, card readers and USB SSDs alike) or ``ID_PATH`` runs through USB; ``loop``,
  ``mmc`` (SD slots and eMMC), ``nvme`` and ``virtio`` by the kernel's device name;
  ``ata`` and ``scsi`` from ``ID_BUS``; anything else ``unknown``. The ``removable``
  flag is never read: USB SSDs lack it, and internal SD slots have it.
* **A labelled medium that is not allowed is refused** (``MediaKind.REFUSED``, with
  the reason in plain words), reported once per plug-in: repeated ``change`` events
  of the same device with the same filesystem and reason are not reported again; a
  removal, or another filesystem on the device, makes the next sighting new.
* **A medium that looks meant for nodeagent but whose label does not match is refused
  too, saying so** (``label_mismatch``): any filesystem on a USB stick, and on any bus a
  label that matches but for its case. The node's own disks are never mentioned.
* **The label glob is case-sensitive** (``fnmatch.fnmatchcase``), as a udev rule's
  ``ID_FS_LABEL=="NODEAGENT*"`` is, so ``udevadm info`` on the device shows an
  operator what nodeagent matches against. The default ``NODEAGENT*`` is upper case because
  Windows stores FAT labels in upper case and ISO 9660 volume ids are upper case
  by specification. The label is the filesystem's own (``ID_FS_LABEL_ENC`` with
  udev's ``\\xNN`` escapes decoded), not udev's sanitised ``ID_FS_LABEL`` in which
  a space became ``_``. A filesystem without a label never matches, not even ``*``.
* **add and change are alike.** A loop device that is re-used, a card put in a
  reader, a filesystem made on a device that was empty: each arrives as
  ``change``, not ``add``. Every ``add``/``change`` is judged by what the device
  carries now; the tracker reports an arrival when that differs from what it knew.
* **Removal** is a ``remove`` event of a tracked device, or a ``change`` after
  which a tracked device no longer carries bundle media (loop detach, card
  pulled out of a reader, device re-formatted or re-labelled).

Mounting is read-only with ``ro,nosuid,nodev,noexec`` always, plus options that
keep a read-only mount from writing to the medium: a read-only mount of ext3/ext4
or XFS with a dirty journal/log otherwise REPLAYS it, writing to the stick
(``noload`` for ext3/ext4, ``norecovery`` for XFS, ``rescue=nologreplay`` for
btrfs). The price: the files of a medium pulled out uncleanly may be
inconsistent; bundle verification (every file hashed) catches that.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Container, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from nodeagent.config.settings import KNOWN_MEDIA_BUSES, KNOWN_MEDIA_FS_TYPES
from nodeagent.strict import clip, quoted

DEFAULT_LABEL_PATTERN = "NODEAGENT*"

KNOWN_FS_TYPES: frozenset[str] = frozenset(KNOWN_MEDIA_FS_TYPES)
"""Filesystem types (blkid's ``ID_FS_TYPE``, which is also the kernel's name) that
``[bundles] media_fs_types`` may name. squashfs has no label at all, so squashfs media never
match a label glob; erofs has one, but Debian 12's mkfs.erofs (erofs-utils 1.5) cannot set it."""

DEFAULT_FS_TYPES: frozenset[str] = frozenset({"ext4", "vfat"})
"""What nodeagent mounts unless configured otherwise: ext4 (what a Linux workstation or the
factory writes, no file size limit) and vfat (what any laptop writes; 4 GiB - 1 per file,
so a bundle whose largest blob is bigger needs ext4 or exfat). Each other type is more
kernel code a crafted stick can reach (docs/decisions/0054-which-media-count.md)."""

KNOWN_BUSES: tuple[str, ...] = KNOWN_MEDIA_BUSES
"""What ``media_bus`` tells apart, and ``[bundles] media_buses`` may name."""

DEFAULT_BUSES: frozenset[str] = frozenset({"usb"})
"""Media are taken from USB only unless configured otherwise: a stick, a USB card reader
or a USB SSD. ``mmc`` (a built-in SD slot) is off by default because on edge boards the
same bus carries the internal eMMC; ``loop`` is what tests attach."""

_KERNEL_NAME_BUSES: tuple[tuple[str, str], ...] = (
    ("loop", "loop"),
    ("mmcblk", "mmc"),
    ("nvme", "nvme"),
    ("vd", "virtio"),
)
_ID_BUSES: frozenset[str] = frozenset({"usb", "ata", "scsi"})

BASE_MOUNT_OPTIONS: tuple[str, ...] = ("ro", "nosuid", "nodev", "noexec")
"""Options every media mount gets, whatever the filesystem."""

FS_MOUNT_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "ext3": ("noload",),  # do not replay the journal (a ro mount would write it)
    "ext4": ("noload",),
    "xfs": ("norecovery",),  # do not replay the log (needs ro)
    "btrfs": ("rescue=nologreplay",),  # do not replay the log tree (needs ro)
}
"""Filesystem-specific extras that keep a read-only mount from writing to the medium."""

RULE_MARK = "NODEAGENT_MEDIA"
"""The udev property ``systemd/90-nodeagent.rules`` sets on media whose label it matches."""

_BLOCK_DEVTYPES = frozenset({"disk", "partition"})
_ARRIVAL_ACTIONS = frozenset({"add", "change"})
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME_CHARS = 120


class MediaKind(StrEnum):
    ARRIVED = "arrived"
    """The device now carries bundle media (new, or different from before)."""
    REMOVED = "removed"
    """The bundle media the device carried is gone."""
    REFUSED = "refused"
    """A labelled medium that nodeagent will not mount: its filesystem or its bus is not
    allowed (``MediaEvent.refusal`` says which, in plain words). Nothing was mounted."""


@dataclass(frozen=True, slots=True)
class MediaEvent:
    """Bundle media arrived on, or left, a block device."""

    kind: MediaKind
    devnode: str
    """The device node, e.g. ``/dev/sdb1`` or ``/dev/loop3``."""
    label: str
    """The filesystem label (decoded); empty in a removal classify could not enrich."""
    fs_type: str
    """blkid's filesystem type, e.g. ``ext4``; the kernel's name for it too."""
    uuid: str
    """The filesystem UUID; empty for filesystems without one (squashfs)."""
    action: str
    """The udev action that told us: ``add``, ``change`` or ``remove``."""
    seqnum: int | None = None
    """The kernel's event sequence number, for the journal; None for enumerated devices."""
    is_rule_marked: bool = False
    """udev's rule ``90-nodeagent.rules`` marked the device (``NODEAGENT_MEDIA=1``): logged, so
    an operator sees whether the package's rule, which also starts the unit, saw the medium."""
    bus: str = ""
    """``media_bus`` of the device (``usb``, ``loop``, ...); empty in a removal."""
    refusal: str = ""
    """Why a ``REFUSED`` medium is not mounted, in plain words; empty otherwise."""

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """What makes two sightings of the same device the same media (or the same refusal)."""
        return (self.fs_type, self.uuid, self.label, self.refusal)


def decode_udev_string(encoded: str) -> str:
    """Undo udev's ``\\xNN`` escaping (``ID_FS_LABEL_ENC``); invalid UTF-8 is replaced."""
    raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), encoded.encode("utf-8", "replace"))
    return raw.decode("utf-8", "replace")


def filesystem_label(props: Mapping[str, str]) -> str:
    """The label as the filesystem stores it (see the module docstring)."""
    encoded = props.get("ID_FS_LABEL_ENC")
    if encoded is not None:
        return decode_udev_string(encoded)
    return props.get("ID_FS_LABEL", "")


def is_label_match(label: str, label_pattern: str) -> bool:
    """Case-sensitive glob match; an empty label never matches."""
    return bool(label) and fnmatch.fnmatchcase(label, label_pattern)


def is_labelled_medium(props: Mapping[str, str], *, label_pattern: str) -> bool:
    """True when the block device holds a filesystem whose label matches: a medium that
    claims to carry a bundle, allowed or not."""
    return props.get("ID_FS_USAGE") == "filesystem" and is_label_match(
        filesystem_label(props), label_pattern
    )


def media_bus(props: Mapping[str, str]) -> str:
    """Where the block device sits (see the module docstring): one of ``KNOWN_BUSES`` or
    ``unknown``. Read from what udev's builtins found in the kernel's device tree
    (``ID_BUS``, ``ID_PATH``) and the kernel's device name, never from the medium."""
    id_bus = props.get("ID_BUS", "")
    if id_bus == "usb" or "-usb-" in props.get("ID_PATH", ""):
        return "usb"
    kernel_name = props.get("DEVNAME", "").rsplit("/", 1)[-1]
    for prefix, bus in _KERNEL_NAME_BUSES:
        if kernel_name.startswith(prefix):
            return bus
    return id_bus if id_bus in _ID_BUSES else "unknown"


def _names(allowed: Iterable[str]) -> str:
    return ", ".join(sorted(allowed)) or "none"


def refusal_of(
    props: Mapping[str, str],
    *,
    fs_types: Collection[str] = DEFAULT_FS_TYPES,
    buses: Collection[str] = DEFAULT_BUSES,
) -> str:
    """Why a labelled medium is not mounted, in plain words; empty when it is allowed."""
    fs_type = props.get("ID_FS_TYPE", "")
    if fs_type not in fs_types:
        return (
            f"its filesystem {clip(fs_type, 32) or '(none)'} is not one nodeagent mounts "
            f"([bundles] media_fs_types: {_names(fs_types)}); copy the bundle to a stick "
            "formatted with one of those"
        )
    bus = media_bus(props)
    if bus not in buses:
        return (
            f"it is on the {bus} bus, which nodeagent does not take media from "
            f"([bundles] media_buses: {_names(buses)}); plug the stick into a USB port"
        )
    return ""


def label_mismatch(props: Mapping[str, str], label_pattern: str) -> str:
    """Why a medium that looks meant for nodeagent is not taken, when its label is the only
    reason; empty otherwise. Said for a filesystem on a USB stick whatever its label (a
    technician plugged it in for a reason), and on any bus for a label that matches but for
    its case (``nodeagent-1`` against ``NODEAGENT*``); never for the node's own disks."""
    label = filesystem_label(props)
    if props.get("ID_FS_USAGE") != "filesystem" or not props.get("ID_FS_TYPE"):
        return ""
    is_case_only = bool(label) and fnmatch.fnmatch(label.casefold(), label_pattern.casefold())
    if not is_case_only and media_bus(props) != "usb":
        return ""
    shown = quoted(label, 64) if label else "(no label)"
    case_note = " (the match is case-sensitive)" if is_case_only else ""
    return (
        f"its label {shown} does not match [bundles] label_pattern "
        f"{quoted(label_pattern)}{case_note}; label the stick to match (for example "
        f"NODEAGENT) and plug it in again"
    )


def carries_bundle_media(
    props: Mapping[str, str],
    *,
    label_pattern: str,
    fs_types: Collection[str] = DEFAULT_FS_TYPES,
    buses: Collection[str] = DEFAULT_BUSES,
) -> bool:
    """True when the block device's filesystem is one nodeagent mounts and imports."""
    return is_labelled_medium(props, label_pattern=label_pattern) and not refusal_of(
        props, fs_types=fs_types, buses=buses
    )


def _seqnum(props: Mapping[str, str]) -> int | None:
    text = props.get("SEQNUM", "")
    return int(text) if text.isdigit() else None


def _event(kind: MediaKind, props: Mapping[str, str], action: str, refusal: str = "") -> MediaEvent:
    seen = kind is not MediaKind.REMOVED
    return MediaEvent(
        kind=kind,
        devnode=props["DEVNAME"],
        label=filesystem_label(props) if seen else "",
        fs_type=props.get("ID_FS_TYPE", "") if seen else "",
        uuid=props.get("ID_FS_UUID", "") if seen else "",
        action=action,
        seqnum=_seqnum(props),
        is_rule_marked=props.get(RULE_MARK) == "1",
        bus=media_bus(props) if seen else "",
        refusal=refusal,
    )


def _is_block_device(props: Mapping[str, str]) -> bool:
    return (
        props.get("SUBSYSTEM") == "block"
        and props.get("DEVTYPE") in _BLOCK_DEVTYPES
        and bool(props.get("DEVNAME"))
    )


def classify(
    props: Mapping[str, str],
    *,
    label_pattern: str,
    fs_types: Collection[str] = DEFAULT_FS_TYPES,
    buses: Collection[str] = DEFAULT_BUSES,
    tracked: Container[str] = frozenset(),
) -> MediaEvent | None:
    """Decide what one udev event (or enumerated device) means for bundle media.

    ``props`` are the udev properties; a missing ``ACTION`` (an enumerated device)
    counts as ``add``. ``tracked`` holds the device nodes currently known to carry
    bundle media: only they can be removed. Returns an arrival (the device carries
    bundle media now, maybe the same as before: ``MediaTracker`` de-duplicates), a
    refusal (a labelled medium of a filesystem or on a bus not allowed), a removal, or
    None when the event is irrelevant.
    """
    if not _is_block_device(props):
        return None
    action = props.get("ACTION", "add")
    if action in _ARRIVAL_ACTIONS and is_labelled_medium(props, label_pattern=label_pattern):
        refusal = refusal_of(props, fs_types=fs_types, buses=buses)
        kind = MediaKind.REFUSED if refusal else MediaKind.ARRIVED
        return _event(kind, props, action, refusal)
    if action in _ARRIVAL_ACTIONS and (unmatched := label_mismatch(props, label_pattern)):
        return _event(MediaKind.REFUSED, props, action, unmatched)
    is_gone = action == "remove" or action in _ARRIVAL_ACTIONS
    if is_gone and props["DEVNAME"] in tracked:
        return _event(MediaKind.REMOVED, props, action)
    return None


def mount_options(fs_type: str) -> str:
    """The mount options for media of ``fs_type``: always read-only, nosuid, nodev, noexec."""
    return ",".join((*BASE_MOUNT_OPTIONS, *FS_MOUNT_OPTIONS.get(fs_type, ())))


WRITABLE_MOUNT_OPTIONS: tuple[str, ...] = ("nosuid", "nodev", "noexec")
"""``support-dump --to-stick``: the one mount nodeagent makes writable, still without
set-uid files, device nodes or programs; a FAT stick's files read 0600 (``umask=077``)."""


def writable_mount_options(fs_type: str) -> str:
    """The options of ``support-dump --to-stick``'s mount of a stick (decision 0072)."""
    extra = ("umask=077",) if fs_type == "vfat" else ()
    return ",".join((*WRITABLE_MOUNT_OPTIONS, *extra))


def mount_dir_name(event: MediaEvent) -> str:
    """A file name for the media's mount point: ``<label>-<uuid or kernel device name>``.

    Only ``[A-Za-z0-9._-]`` survive (anything else becomes ``_``), so a label can
    never escape the media directory; the UUID (or, for filesystems without one,
    the device name) keeps two sticks with the same label apart.
    """
    suffix = event.uuid or event.devnode.rsplit("/", 1)[-1]
    name = _UNSAFE_NAME_CHARS.sub("_", f"{event.label}-{suffix}").lstrip(".")
    return name[:_MAX_NAME_CHARS] or "media"


class MediaTracker:
    """Turns udev property sets into arrivals and removals, each reported once.

    Loop devices and readers send the same state several times (two ``change``
    events per attach, a re-trigger as ``add``); only a difference in what the
    device carries is reported. A device that now carries OTHER bundle media
    (re-formatted, re-labelled) is reported removed, then arrived.
    """

    def __init__(
        self,
        *,
        label_pattern: str,
        fs_types: Collection[str] = DEFAULT_FS_TYPES,
        buses: Collection[str] = DEFAULT_BUSES,
    ) -> None:
        self._label_pattern = label_pattern
        self._fs_types = fs_types
        self._buses = buses
        self._present: dict[str, MediaEvent] = {}
        self._refused: dict[str, MediaEvent] = {}

    @property
    def present(self) -> Mapping[str, MediaEvent]:
        """Device node -> the arrival of the bundle media it carries now."""
        return dict(self._present)

    def feed(self, props: Mapping[str, str]) -> list[MediaEvent]:
        """What one udev event changes: nothing, an arrival, a refusal, a removal, or a
        removal and then an arrival or a refusal."""
        event = classify(
            props,
            label_pattern=self._label_pattern,
            fs_types=self._fs_types,
            buses=self._buses,
            tracked=self._present,
        )
        if event is None or event.kind is MediaKind.REMOVED:
            self._refused.pop(props.get("DEVNAME", ""), None)  # the next sighting is new
        if event is None:
            return []
        if event.kind is MediaKind.REMOVED:  # classify removes tracked devices only
            return [_removal_of(self._present.pop(event.devnode), event)]
        if event.kind is MediaKind.REFUSED:
            return self._refuse(event)
        self._refused.pop(event.devnode, None)
        old = self._present.get(event.devnode)
        if old is not None and old.identity == event.identity:
            return []
        self._present[event.devnode] = event
        return [event] if old is None else [_removal_of(old, event), event]

    def _refuse(self, event: MediaEvent) -> list[MediaEvent]:
        """A refusal once per device, filesystem and reason; what the device carried goes."""
        old = self._present.pop(event.devnode, None)
        gone = [] if old is None else [_removal_of(old, event)]
        known = self._refused.get(event.devnode)
        if known is not None and known.identity == event.identity:
            return gone
        self._refused[event.devnode] = event
        return [*gone, event]

    def reconcile(self, snapshot: Iterable[Mapping[str, str]]) -> list[MediaEvent]:
        """Bring the tracked set in line with a full enumeration of block devices.

        Used at start (nothing tracked: every matching device arrives) and after
        udev events were lost (socket overflow): tracked devices missing from the
        snapshot, or no longer carrying bundle media, are removed.
        """
        events: list[MediaEvent] = []
        seen: set[str] = set()
        for props in snapshot:
            enumerated = {key: value for key, value in props.items() if key != "ACTION"}
            events += self.feed(enumerated)
            seen.add(enumerated.get("DEVNAME", ""))
        for devnode in set(self._refused) - seen:
            del self._refused[devnode]
        for devnode in sorted(set(self._present) - seen):
            old = self._present.pop(devnode)
            events.append(replace(old, kind=MediaKind.REMOVED, action="remove", seqnum=None))
        return events


def _removal_of(old: MediaEvent, cause: MediaEvent) -> MediaEvent:
    return replace(old, kind=MediaKind.REMOVED, action=cause.action, seqnum=cause.seqnum)
