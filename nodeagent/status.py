"""The node's status: what nodeagent reports, as plain values and as JSON.

One ``NodeStatus`` per sync. It is written to the state directory for
``nodeagent status`` and (cluster mode) applied to the node's status object.
Field names and semantics follow OpenShift's MachineConfigNode for sets:
``desiredGeneration``, ``currentGeneration`` (only once complete),
``lastFailedGeneration`` and its error. Generations never decrease.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from nodeagent.fips import CryptoPosture
from nodeagent.nodeos import OsImage

MAX_FAILED_IMAGES = 20
"""Failing images listed per set; the count is always exact."""
MAX_ERROR_CHARS = 32768
"""MachineConfigNode's limit for ``lastFailedGenerationError``."""

SetState = Literal["Pinned", "Progressing", "Degraded", "Refused"]


@dataclass(frozen=True, slots=True)
class ImageFailure:
    ref: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class SetStatus:
    name: str
    source: str
    is_persistent: bool
    state: SetState
    desired_generation: int
    current_generation: int | None
    last_failed_generation: int | None
    last_failed_error: str | None
    images_total: int
    images_present: int
    images_pinned: int
    failures: tuple[ImageFailure, ...] = ()
    reason: str | None = None
    bytes_present: int = 0
    """Size in the runtime's store of the set's images that are present (CRI ``size``)."""
    bytes_to_pull: int = 0
    """Compressed bytes still to download for the set (registry manifests; 0 when unknown)."""
    pending: tuple[str, ...] = field(default=(), compare=False)
    """Images not present when the sync started: live progress counts them as they arrive."""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "persistent": self.is_persistent,
            "state": self.state,
            "desiredGeneration": self.desired_generation,
            "images": {
                "total": self.images_total,
                "present": self.images_present,
                "pinned": self.images_pinned,
                "failed": len(self.failures),
            },
            "bytes": {"present": self.bytes_present, "toPull": self.bytes_to_pull},
        }
        optional = {
            "currentGeneration": self.current_generation,
            "lastFailedGeneration": self.last_failed_generation,
            "lastFailedGenerationError": self.last_failed_error,
            "reason": self.reason,
        }
        doc |= {key: value for key, value in optional.items() if value is not None}
        if self.failures:
            doc["failedImages"] = [
                {"image": f.ref, "reason": f.reason, "message": f.message}
                for f in self.failures[:MAX_FAILED_IMAGES]
            ]
        return doc


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    is_true: bool
    reason: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {
            "type": self.type,
            "status": "True" if self.is_true else "False",
            "reason": self.reason,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class DiskStatus:
    mountpoint: str
    available_bytes: int
    needed_bytes: int
    reserve_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "mountpoint": self.mountpoint,
            "availableBytes": self.available_bytes,
            "neededBytes": self.needed_bytes,
            "reserveBytes": self.reserve_bytes,
        }


@dataclass(frozen=True, slots=True)
class MirrorStatus:
    """The node mirror (``[mirror]``, docs/mirror.md): its state, and its counts as the mirror
    process last reported them."""

    serving: bool
    """A fresh report of the mirror process says it serves (``state == "serving"``)."""
    listen: str
    blobs: int
    """Bundle blobs served to any local client."""
    registry_blobs: int
    """Registry-set blobs served to clients with the mirror's credential."""
    requests: int
    bytes_served: int
    missing: int
    """Manifests and blobs asked for that the store does not hold."""
    denied: int
    """Registry-set content asked for without the credential."""
    recent_missing: tuple[str, ...] = ()
    reported_at: str = ""
    state: str = ""
    """``serving``; ``ready`` (its socket is held, the process starts on the first request);
    ``failed`` (nothing holds the port); ``unknown`` (systemd could not be asked, or the
    process's reports stopped: never taken for serving). Decision 0063."""

    def to_json(self) -> dict[str, Any]:
        return {
            "serving": self.serving,
            "state": self.state or ("serving" if self.serving else "unknown"),
            "listen": self.listen,
            "blobs": self.blobs,
            "registryBlobs": self.registry_blobs,
            "requests": self.requests,
            "bytesServed": self.bytes_served,
            "missing": self.missing,
            "denied": self.denied,
            "recentMissing": list(self.recent_missing),
            "reportedAt": self.reported_at,
        }


@dataclass(frozen=True, slots=True)
class NodeStatus:
    sets: tuple[SetStatus, ...]
    conditions: tuple[Condition, ...]
    runtime: str | None = None
    disk: DiskStatus | None = None
    problems: tuple[Mapping[str, str], ...] = ()
    last_error: str | None = None
    pulling: int = 0
    updated_at: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    repairs: tuple[Mapping[str, str], ...] = ()
    """Damaged state files set aside since the daemon started (``ledger.Repair``)."""
    boot_id: str = ""
    """The boot this status was made in: a rebuilt ledger trusts transient sets' generations
    only from a status of the same boot."""
    retry_in_s: float | None = None
    """Seconds until the sync loop tries again after a transient failure (None: at the resync)."""
    image_loss: Mapping[str, object] | None = None
    """Pinned images the runtime lost, found at the last sync (``sync.losses.ImageLoss``)."""
    bundles: tuple[BundleReport, ...] = ()
    """Bundles seen (``reporting.BundleBoard``), added by the reporter."""
    releases: tuple[ReleaseReport, ...] = ()
    """The releases the node's store holds (``adapters.store.releases``), added by the
    reporter."""
    os_image: OsImage | None = None
    """The node's OS release and booted image (``nodeos``), added by the reporter."""
    mirror: MirrorStatus | None = None
    """The node mirror as the peer process last reported it, added by the reporter."""
    crypto: CryptoPosture | None = None
    """FIPS mode and Ed25519 (``fips``), read at start, added by the reporter."""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "updatedAt": self.updated_at,
            "conditions": [c.to_json() for c in self.conditions],
            "pinnedImageSets": [s.to_json() for s in self.sets],
            "images": self.image_totals(),
        }
        if self.runtime:
            doc["runtime"] = self.runtime
        if self.disk:
            doc["disk"] = self.disk.to_json()
        if self.problems:
            doc["specProblems"] = [dict(p) for p in self.problems]
        if self.last_error:
            doc["lastError"] = self.last_error
        if self.repairs:
            doc["stateRepairs"] = [dict(r) for r in self.repairs]
        if self.boot_id:
            doc["bootId"] = self.boot_id
        if self.retry_in_s is not None:
            doc["retryInSeconds"] = round(self.retry_in_s, 1)
        return doc | self._observed() | dict(self.extra)

    def _observed(self) -> dict[str, Any]:
        """What the reporter adds beside the sync's findings: losses, bundles, the OS."""
        doc: dict[str, Any] = {}
        if self.image_loss is not None:
            doc["imageLoss"] = dict(self.image_loss)
        if self.bundles:
            doc["bundles"] = [report.to_json() for report in self.bundles]
        if self.os_image is not None:
            doc["osImage"] = self.os_image.to_json()
        if self.mirror is not None:
            doc["nodeMirror"] = self.mirror.to_json()
        if self.crypto is not None:
            doc["crypto"] = self.crypto.to_json()
        return doc

    def image_totals(self) -> dict[str, int]:
        return {
            "total": sum(s.images_total for s in self.sets),
            "present": sum(s.images_present for s in self.sets),
            "pinned": sum(s.images_pinned for s in self.sets),
            "failed": sum(len(s.failures) for s in self.sets),
            "pulling": self.pulling,
        }


@dataclass(frozen=True, slots=True)
class PullProgress:
    """Live pull counters while a sync runs (a snapshot)."""

    pulling: tuple[str, ...] = ()
    pulled: frozenset[str] = frozenset()
    failed: int = 0
    is_syncing: bool = False

    @property
    def is_busy(self) -> bool:
        return self.is_syncing or bool(self.pulling)


BundleState = Literal[
    "detected",
    "verified",
    "admitted",
    "fetching",
    "storing",
    "stored",
    "importing",
    "imported",
    "pinned",
    "rejected",
    "interrupted",
]


@dataclass(frozen=True, slots=True)
class ReleaseReport:
    """The OpenShift release a bundle carries, and whether it upgrades the cluster's version
    (``versions.check_upgrade_path`` at the import; ``path_reason`` empty when it does, or when
    the cluster's version was not known)."""

    version: str
    digest: str
    """The release image's digest, ``sha256:<hex>``."""
    set_name: str
    path_reason: str = ""
    """``ReleaseNotAnUpgrade`` or ``ReleaseVersionInvalid``; ``""`` when not refused."""
    path_message: str = ""
    cluster_version: str = ""
    """The cluster's version the release was checked against (``""``: not known)."""
    is_upgrade: bool = False
    """It upgrades the cluster's version (the path check passed and it is newer)."""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"version": self.version, "digest": self.digest, "set": self.set_name}
        if self.cluster_version:
            doc["clusterVersion"] = self.cluster_version
            doc["upgrade"] = self.is_upgrade
        if self.path_reason:
            doc |= {"reason": self.path_reason, "message": self.path_message}
        return doc


@dataclass(frozen=True, slots=True)
class BundleReport:
    """What a technician needs to know about one bundle, at any step."""

    source: str
    state: BundleState
    bundle_id: str = ""
    signed_by: str = ""
    images_total: int = 0
    images_present: int = 0
    bytes_total: int = 0
    bytes_served: int = 0
    reason: str | None = None
    message: str | None = None
    is_already_imported: bool = False
    sets: tuple[str, ...] = ()
    progress: Mapping[str, object] | None = None
    """Bytes of the current step (fetching, storing, importing):
    ``progress.ByteProgress.to_json``."""
    progress_text: str = ""
    """The same for a person: '312 MiB of 1 GiB (30 %), 38.2 MB/s, about 18 s left'."""
    is_medium_removable: bool = False
    """The bundle is in the node's store: the medium may be removed."""
    next_steps: tuple[str, ...] = ()
    """A release bundle's (``bundles.release.next_steps``): shown once its sets are pinned."""
    warnings: tuple[tuple[str, str], ...] = ()
    """(reason, message) of what did not stop the import but needs a technician."""
    frozen_tags: tuple[tuple[str, str], ...] = ()
    """(``host/repository:tag``, digest) the bundle serves (``bundle create --serve-tags``):
    pulls of those tags get that digest while the node's mirror serves it, even once the
    registry moves the tag (``bundles.tags``)."""
    release: ReleaseReport | None = None
    """A release bundle's release, and the upgrade-path check against the cluster's version."""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "source": self.source,
            "state": self.state,
            "bundleId": self.bundle_id,
            "signedBy": self.signed_by,
            "images": {"total": self.images_total, "present": self.images_present},
            "bytes": {"total": self.bytes_total, "served": self.bytes_served},
            "pinnedImageSets": list(self.sets),
        }
        if self.is_already_imported:
            doc["alreadyImported"] = True
        if self.progress is not None:
            doc["progress"] = dict(self.progress) | {"text": self.progress_text}
        if self.is_medium_removable:
            doc["mediumRemovable"] = True
        if self.next_steps and self.state == "pinned":
            doc["nextSteps"] = list(self.next_steps)
        if self.reason:
            doc |= {"reason": self.reason, "message": self.message or ""}
        if self.warnings:
            doc["warnings"] = [{"reason": r, "message": m} for r, m in self.warnings]
        if self.frozen_tags:
            doc["frozenTags"] = dict(self.frozen_tags)
        if self.release is not None:
            doc["release"] = self.release.to_json()
        return doc


def truncate_error(text: str) -> str:
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return text[: MAX_ERROR_CHARS - 14] + " …(truncated)"


def conditions_for(
    sets: Sequence[SetStatus], problems: int, sync_error: tuple[str, str] | None
) -> tuple[Condition, ...]:
    """Ready / Progressing / Degraded from the per-set states.

    ``sync_error`` is the (reason, message) of a sync that could not run at all: the
    runtime down, a state file that cannot be written ...; it names the Degraded cause.
    """
    progressing = [s.name for s in sets if s.state == "Progressing"]
    bad = [s for s in sets if s.state in ("Degraded", "Refused")]
    if sync_error is not None:
        degraded = Condition("Degraded", True, sync_error[0], sync_error[1])
    elif bad:
        first = bad[0]
        degraded = Condition(
            "Degraded",
            True,
            first.reason or first.state,
            f"{len(bad)} PinnedImageSet(s) failed: " + ", ".join(s.name for s in bad),
        )
    elif problems:
        degraded = Condition("Degraded", True, "SpecInvalid", f"{problems} invalid spec(s)")
    else:
        degraded = Condition("Degraded", False, "AsExpected", "no failures")
    busy = Condition(
        "Progressing",
        bool(progressing),
        "Pulling" if progressing else "AsExpected",
        ("working on " + ", ".join(progressing)) if progressing else "nothing to do",
    )
    is_ready = not progressing and not degraded.is_true
    pinned = sum(s.images_pinned for s in sets)
    ready = Condition(
        "Ready",
        is_ready,
        "AllPinned" if is_ready else (degraded.reason if degraded.is_true else "Pulling"),
        f"{pinned} images pinned in {sum(1 for s in sets if s.state == 'Pinned')} set(s)",
    )
    return (ready, busy, degraded)


def progress_line(pinned: int, total: int, pulling: int = 0, failed: int = 0) -> str:
    """'pinned 183/190 images, pulling 4, 1 failed': the counts part of systemd's STATUS=."""
    line = f"pinned {pinned}/{total} images"
    if pulling:
        line += f", pulling {pulling}"
    if failed:
        line += f", {failed} failed"
    return line


def status_line(status: NodeStatus) -> str:
    """The one line for systemd's STATUS=: 'pinned 183/190 images, pulling 4'."""
    totals = status.image_totals()
    line = progress_line(totals["pinned"], totals["total"], totals["pulling"], totals["failed"])
    degraded = next((c for c in status.conditions if c.type == "Degraded" and c.is_true), None)
    if degraded is not None:
        line += f" ({degraded.reason})"
    return line


def bundle_line(report: BundleReport) -> str | None:
    """STATUS= while a bundle is copied or imported, or None (the sync's line stands)."""
    name = report.bundle_id or report.source
    progress = f": {report.progress_text}" if report.progress_text else ""
    if report.state == "stored":
        if report.is_medium_removable:
            return f"bundle {name} stored: the medium may be removed"
        return f"bundle {name} stored: verified in the image store"
    lines = {
        "storing": f"bundle {name}: copying to the image store{progress}",
        "fetching": f"bundle {name}: fetching from peers{progress}",
        "importing": f"bundle {name}: importing {report.images_total} images{progress}",
    }
    if report.state == "detected" and report.progress_text:
        return f"bundle {name}: {report.progress_text}"
    return lines.get(report.state)


# ---------------------------------------------------------------- builders
def set_outcome(
    *,
    refused_error: str | None,
    failures: Sequence[ImageFailure],
    pin_error: tuple[str, str] | None,
    is_all_pinned: bool,
    unsized_error: str | None = None,
) -> tuple[SetState, str | None, str | None]:
    """A set's state after a sync, with the reason and error it is reported with.

    ``pin_error`` is the (reason, message) of pins that did not take effect;
    ``unsized_error`` says why the set was held because an image's size is unknown.
    """
    if refused_error is not None:
        return "Refused", "InsufficientDiskSpace", refused_error
    if unsized_error is not None:
        return "Degraded", "SizeUnknown", unsized_error
    if failures:
        first = failures[0]
        text = (
            f"{len(failures)} image(s) failed; first {first.ref}: {first.reason}: {first.message}"
        )
        return "Degraded", first.reason, text
    if pin_error is not None:
        return "Degraded", pin_error[0], pin_error[1]
    if is_all_pinned:
        return "Pinned", None, None
    return "Progressing", None, None


def interim_state(
    *,
    is_refused: bool,
    pending: Sequence[str],
    current_generation: int | None,
    generation: int,
    is_unsized: bool = False,
) -> SetState:
    """A set's state while the sync's pulls run."""
    if is_refused:
        return "Refused"
    if is_unsized:
        return "Degraded"
    if not pending and current_generation == generation:
        return "Pinned"
    return "Progressing"


def node_status(
    sets: Sequence[SetStatus],
    *,
    runtime: str | None,
    disk: DiskStatus | None,
    problems: Sequence[Mapping[str, str]] = (),
    last_error: str | None = None,
    updated_at: str = "",
    repairs: Sequence[Mapping[str, str]] = (),
    boot_id: str = "",
    image_loss: Mapping[str, object] | None = None,
) -> NodeStatus:
    """The node's status from its sets: conditions derived, nothing else added."""
    return NodeStatus(
        sets=tuple(sets),
        conditions=conditions_for(sets, len(problems), None),
        runtime=runtime,
        disk=disk,
        problems=tuple(problems),
        last_error=last_error,
        updated_at=updated_at,
        repairs=tuple(repairs),
        boot_id=boot_id,
        image_loss=image_loss,
    )


def waiting_conditions(
    conditions: Sequence[Condition], reason: str, message: str
) -> tuple[Condition, ...]:
    """The conditions while pulls wait on a transient cause (the runtime down, the registry
    failing): Degraded and not Ready, with that cause as the reason."""
    waiting = {
        "Degraded": Condition("Degraded", True, reason, message),
        "Ready": Condition("Ready", False, reason, message),
    }
    return tuple(waiting.get(c.type, c) for c in conditions)
