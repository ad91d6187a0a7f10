"""The bundle Importer over fake ports: its steps, reports and what it leaves behind.

Real: the importer, the manifest parser, disk admission's arithmetic and the pre-puller
(virtual time). Fake: verification (a parsed manifest, as if its signature and tree were
checked), the runtime (``FakeCrio``), the loopback server, the registries.conf mirror
drop-in, the reloader, free space, the spec directories and the state directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pytest
import structlog
import yaml
from structlog.testing import capture_logs

from nodeagent.bundles.freshness import Stamp
from nodeagent.bundles.import_ports import ImporterPorts
from nodeagent.bundles.importer import Importer
from nodeagent.bundles.manifest import (
    BundleDigestMismatch,
    BundleError,
    BundleManifest,
    ExpectedFile,
    parse_manifest,
)
from nodeagent.disk import DiskPolicy
from nodeagent.errors import (
    ConfigInvalid,
    NodeAgentError,
    RuntimeCallFailed,
    RuntimeReloadFailed,
)
from nodeagent.prepull import PrePuller, PullPolicy
from nodeagent.status import BundleReport
from tests.fakes.clock import VirtualClock, run_inline
from tests.fakes.crio import FakeCrio, MemoryDropins
from tests.fakes.ports import (
    FakeMirror,
    FakeServer,
    FakeVerified,
    FixedSpace,
    MemorySpecs,
    MemoryStore,
)
from tests.fakes.reloader import RecordingReloader

MIB = 1024**2
GIB = 1024**3
BUNDLE_ID = "line-3.2026-11-22"
ROOT = Path("/run/nodeagent/media/NODEAGENT-1234")
APP = "quay.io/acme/app@sha256:" + "1" * 64
DB = "registry.example.com:5000/acme/db@sha256:" + "2" * 64
BLOB_BYTES = {"1": 4000, "2": 3000, "3": 300 * MIB, "4": 200 * MIB}
"""Blob digest (one hex digit repeated) -> size: the two image manifests and one layer each."""
TOTAL = sum(BLOB_BYTES.values())
NOW_S = 1795400000.0
"""The wall clock of the node in these tests: 2026-11-23T02:13:20Z, after the bundle's created."""
SEQUENCE = 1795339800
"""The test bundle's sequence: its ``created`` (2026-11-22T09:30:00Z) in seconds (format 1)."""
KEY = "F00D"
DIGEST = "sha256:" + "f" * 64
"""``FakeVerified``'s key id and manifest digest."""


def set_object(name: str, ref: str) -> dict[str, Any]:
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "PinnedImageSet",
        "metadata": {"name": name},
        "spec": {"pinnedImages": [{"name": ref}]},
    }


def manifest(target: str | None = None, **changes: Any) -> BundleManifest:
    doc: dict[str, Any] = {
        "formatVersion": 1 if target is None else 2,
        "bundleId": BUNDLE_ID,
        "created": "2026-11-22T09:30:00Z",
        "architecture": "amd64",
        "layout": "oci",
        "images": [
            {"name": APP, "manifestDigest": "sha256:" + "1" * 64, "sizeBytes": 300 * MIB + 4000},
            {"name": DB, "manifestDigest": "sha256:" + "2" * 64, "sizeBytes": 200 * MIB + 3000},
        ],
        "blobs": [{"digest": "sha256:" + h * 64, "sizeBytes": n} for h, n in BLOB_BYTES.items()],
        "files": [{"path": "oci-layout", "sha256": "5" * 64, "sizeBytes": 30}],
        "pinnedImageSets": [
            {"persistent": True, "object": set_object("apps", APP)},
            {"persistent": False, "object": set_object("db", DB)},
        ],
    }
    if target is not None:
        doc["target"] = {"nodeSelector": target}
    return parse_manifest(json.dumps(doc | changes).encode())


class Rig:
    def __init__(
        self,
        *,
        available_bytes: int = 20 * GIB,
        reload_failures: int = 0,
        target: str | None = None,
        node_labels: Mapping[str, str] | None = None,
        is_ignoring_target: bool = False,
        labels_later: Mapping[str, str] | Literal["no wait"] | None = "no wait",
        accepted: tuple[Stamp, ...] = (),
        is_allowing_rollback: bool = False,
        is_allowing_expired: bool = False,
        wall_clock_s: float = NOW_S,
        cluster_version: str | None = None,
    ) -> None:
        self.accepted = accepted
        self.manifest_changes: dict[str, Any] = {}
        self.target = target
        self.labels_later = labels_later
        self.label_waits = 0
        self.clock = VirtualClock()
        self.crio = FakeCrio(pull=self._pull)
        self.dropins = MemoryDropins()
        self.reloader = RecordingReloader(self.dropins, self.crio, failures=reload_failures)
        self.mirror = FakeMirror()
        self.specs = MemorySpecs()
        self.store = MemoryStore()
        self.space = FixedSpace(total_bytes=100 * GIB, available_bytes=available_bytes)
        self.reports: list[BundleReport] = []
        self.servers: list[FakeServer] = []
        self.server_rejections: tuple[BundleError, ...] = ()
        self.verify_error: NodeAgentError | None = None
        self.is_present = True
        self.pull_errors: dict[str, list[NodeAgentError]] = {}
        """Per image, the errors its next pulls raise, in order."""
        self.remove_medium_on: str | None = None
        self.mirror_while_pulling: list[bool] = []
        self.importer = Importer(
            ImporterPorts(
                verify=self._verify,
                runtime=self.crio,
                make_server=self._make_server,
                mirror=self.mirror,
                reloader=self.reloader,
                make_puller=self._make_puller,
                space=self.space,
                specs=self.specs,
                store=self.store,
                is_present_on_media=lambda root: root == ROOT and self.is_present,
                on_report=self.reports.append,
                node_labels=lambda: node_labels,
                wait_node_labels=None if labels_later == "no wait" else self._labels_later,
                is_ignoring_target=is_ignoring_target,
                accepted=lambda: self.accepted,
                wall_clock=lambda: wall_clock_s,
                is_allowing_rollback=is_allowing_rollback,
                is_allowing_expired=is_allowing_expired,
                cluster_version=lambda: cluster_version,
            ),
            DiskPolicy(expansion_factor=2.0, reserve_bytes=GIB),
        )

    async def _labels_later(self) -> Mapping[str, str] | None:
        """The cluster's wait: the labels it lists (or None when they did not come in time)."""
        self.label_waits += 1
        assert self.labels_later != "no wait"
        return self.labels_later

    def _verify(self, root: Path) -> FakeVerified:
        assert root == ROOT
        if self.verify_error is not None:
            raise self.verify_error
        found = manifest(self.target, **self.manifest_changes)
        return FakeVerified(found, signed_by="factory-2026", key_id_hex=KEY, manifest_digest=DIGEST)

    def _make_server(self, root: Path, blobs: Mapping[str, ExpectedFile]) -> FakeServer:
        server = FakeServer(root, blobs, bytes_served=TOTAL, rejections=self.server_rejections)
        self.servers.append(server)
        return server

    def _make_puller(self) -> PrePuller:
        return PrePuller(
            self.crio,
            lambda _ref: None,
            PullPolicy(attempts=2, backoff_initial_s=1.0),
            sleep=self.clock.sleep,
            monotonic=self.clock.monotonic,
            rand=lambda: 0.5,
            run_blocking=run_inline,
        )

    async def _pull(self, ref: str) -> None:
        self.mirror_while_pulling.append(self.mirror.is_written)
        if ref == self.remove_medium_on:
            self.is_present = False
        errors = self.pull_errors.get(ref)
        if errors:
            raise errors.pop(0)

    async def run(self) -> BundleReport:
        return await self.importer.import_bundle(ROOT, source="/dev/sdb1")

    def states(self) -> list[str]:
        return [r.state for r in self.reports]


async def test_good_bundle_is_verified_admitted_pulled_through_the_mirror_and_handed_over() -> None:
    rig = Rig()

    report = await rig.run()

    assert rig.states() == ["detected", "verified", "admitted", "importing", "imported"]
    assert report == rig.reports[-1]
    assert (report.bundle_id, report.signed_by, report.source) == (
        BUNDLE_ID,
        "factory-2026",
        "/dev/sdb1",
    )
    assert (report.images_total, report.images_present, report.sets) == (2, 2, ("apps", "db"))
    assert (report.bytes_total, report.bytes_served) == (TOTAL, TOTAL)
    assert report.reason is None
    assert rig.reports[3].images_present == 0
    assert sorted(rig.crio.pull_calls) == [APP, DB]
    assert rig.mirror_while_pulling == [True, True]
    assert rig.mirror.writes == [
        (("quay.io/acme/app", "registry.example.com:5000/acme/db"), "127.0.0.1:5999")
    ]
    assert (rig.mirror.is_written, rig.mirror.removals) == (False, 1)
    assert rig.reloader.calls == 2  # one to apply the mirror, one to drop it
    assert len(rig.servers) == 1
    assert rig.servers[0].calls == ["start", "close"]
    assert sorted(rig.servers[0].blobs) == sorted("sha256:" + h * 64 for h in BLOB_BYTES)
    written = {name: (yaml.safe_load(text), p) for name, (text, p) in rig.specs.files.items()}
    assert written == {
        f"bundle-{BUNDLE_ID}-apps.yaml": (set_object("apps", APP), True),
        f"bundle-{BUNDLE_ID}-db.yaml": (set_object("db", DB), False),
    }
    record = rig.store.docs["bundles"]["imported"][BUNDLE_ID]
    assert (record["images"], record["sets"]) == ([APP, DB], ["apps", "db"])


async def test_already_imported_bundle_is_reported_so_and_pulls_nothing() -> None:
    rig = Rig()
    rig.crio.store(APP)
    rig.crio.store(DB)
    rig.store.docs["bundles"] = {"imported": {BUNDLE_ID: {"sets": ["apps", "db"]}}}

    report = await rig.run()

    assert rig.states() == ["detected", "verified", "imported"]
    assert report.is_already_imported is True
    assert (report.images_present, report.images_total) == (2, 2)
    assert rig.crio.pull_calls == []
    assert (rig.servers, rig.mirror.writes, rig.reloader.calls) == ([], [], 0)
    assert rig.specs.files == {}
    assert rig.space.asked == []


async def test_images_present_but_bundle_never_recorded_hands_over_without_the_mirror() -> None:
    rig = Rig()
    rig.crio.store(APP)
    rig.crio.store(DB)

    report = await rig.run()

    assert rig.states() == ["detected", "verified", "admitted", "imported"]
    assert report.is_already_imported is False
    assert rig.crio.pull_calls == []
    assert (rig.servers, rig.mirror.writes, rig.reloader.calls) == ([], [], 0)
    assert sorted(rig.specs.files) == [
        f"bundle-{BUNDLE_ID}-apps.yaml",
        f"bundle-{BUNDLE_ID}-db.yaml",
    ]
    assert BUNDLE_ID in rig.store.docs["bundles"]["imported"]


@pytest.mark.parametrize("imported", [["line-3"], 5, "x"])
async def test_a_damaged_import_record_is_set_aside_and_the_bundle_imports(
    imported: object,
) -> None:
    rig = Rig()
    rig.crio.store(APP)
    rig.crio.store(DB)
    rig.store.docs["bundles"] = {"imported": imported}

    report = await rig.run()

    assert report.state == "imported"
    assert rig.store.docs["bundles.damaged"] == {"imported": imported}
    assert list(rig.store.docs["bundles"]["imported"]) == [BUNDLE_ID]


async def test_insufficient_disk_rejects_before_the_mirror_is_written() -> None:
    rig = Rig(available_bytes=GIB + 900 * MIB)  # needs 2 x 500 MiB + 1 GiB reserve

    report = await rig.run()

    assert rig.states() == ["detected", "verified", "rejected"]
    assert report.reason == "InsufficientDiskSpace"
    assert report.message is not None
    assert report.message.startswith(f"bundle {BUNDLE_ID} not enough disk space: needs 1000 MiB,")
    assert report.message.endswith("; nothing was copied")
    assert rig.space.asked == ["/var/lib/containers/storage/overlay-images"]
    assert (rig.servers, rig.mirror.writes, rig.reloader.calls) == ([], [], 0)
    assert rig.crio.pull_calls == []
    assert rig.specs.files == {}
    assert "bundles" not in rig.store.docs


async def test_resumed_import_needs_space_for_the_missing_images_only() -> None:
    rig = Rig(available_bytes=GIB + 500 * MIB)  # the whole bundle would not fit
    rig.crio.store(APP)

    report = await rig.run()

    assert rig.states() == ["detected", "verified", "admitted", "importing", "imported"]
    assert rig.reports[2].images_present == 1  # admitted: APP already stored
    assert rig.crio.pull_calls == [DB]
    assert report.images_present == 2


async def test_medium_removed_during_the_pulls_interrupts_and_keeps_what_was_pulled() -> None:
    rig = Rig()
    rig.remove_medium_on = DB
    rig.pull_errors[DB] = [RuntimeCallFailed("reading blob sha256:4444: EIO")] * 2

    report = await rig.run()

    assert rig.states() == ["detected", "verified", "admitted", "importing", "interrupted"]
    assert report.reason == "BundleMediaRemoved"
    assert report.message is not None
    assert "1 of 2 images are in the runtime and stay" in report.message
    assert report.images_present == 1
    assert rig.crio.pull_calls == [APP, DB, DB]  # the pre-puller tried DB twice (attempts=2)
    assert (rig.mirror.is_written, rig.mirror.removals, rig.reloader.calls) == (False, 1, 2)
    assert rig.servers[0].calls == ["start", "close"]
    assert rig.specs.files == {}
    assert "bundles" not in rig.store.docs


async def test_pull_failing_with_the_medium_present_rejects_with_the_pull_reason() -> None:
    rig = Rig()
    rig.pull_errors[DB] = [RuntimeCallFailed("manifest unknown to the mirror")] * 2

    report = await rig.run()

    assert rig.states() == ["detected", "verified", "admitted", "importing", "rejected"]
    assert (report.reason, report.message) == (
        "RuntimeCallFailed",
        "manifest unknown to the mirror",
    )
    assert rig.specs.files == {}
    assert rig.mirror.is_written is False


async def test_first_pull_failing_otherwise_than_unavailable_is_left_to_the_pre_puller() -> None:
    rig = Rig()
    rig.pull_errors[APP] = [RuntimeCallFailed("writing blob: unexpected EOF")]

    report = await rig.run()

    assert report.state == "imported"
    assert rig.crio.pull_calls[0] == APP
    assert sorted(rig.crio.pull_calls) == [APP, APP, DB]
    assert rig.clock.sleeps == []  # the pre-puller's first attempt at APP succeeded


async def test_verification_failure_rejects_with_its_reason_and_touches_nothing() -> None:
    rig = Rig()
    rig.verify_error = BundleDigestMismatch(
        "blobs/sha256/3333 does not match its digest: the bundle is damaged or was altered"
    )

    report = await rig.run()

    assert rig.states() == ["detected", "rejected"]
    assert report.reason == "BundleDigestMismatch"
    assert report.message == rig.verify_error.message
    assert report.bundle_id == ""
    assert (rig.servers, rig.mirror.writes, rig.reloader.calls) == ([], [], 0)
    assert rig.crio.pull_calls == []
    assert rig.space.asked == []


@pytest.mark.parametrize(
    ("labels", "needle"),
    [(None, "labels are not known"), ({"site": "line-4"}, "labels do not match")],
)
async def test_a_stick_whose_target_leaves_the_node_out_is_refused_before_anything(
    labels: Mapping[str, str] | None, needle: str
) -> None:
    rig = Rig(target="site=line-3", node_labels=labels)

    report = await rig.run()

    assert rig.states() == ["detected", "rejected"]
    assert (report.reason, report.bundle_id) == ("BundleNotInTarget", BUNDLE_ID)
    assert needle in (report.message or "")
    assert "'site=line-3'" in (report.message or "")
    assert (rig.servers, rig.mirror.writes, rig.reloader.calls) == ([], [], 0)
    assert (rig.crio.pull_calls, rig.space.asked, rig.specs.files) == ([], [], {})


@pytest.mark.parametrize(
    ("later", "states", "reason"),
    [
        ({"site": "line-3"}, ["detected", "verified", "admitted", "importing", "imported"], None),
        ({"site": "line-4"}, ["detected", "rejected"], "BundleNotInTarget"),
        (None, ["detected", "rejected"], "BundleNotInTarget"),
    ],
)
async def test_labels_not_known_yet_are_waited_for_then_they_decide(
    later: Mapping[str, str] | None, states: list[str], reason: str | None
) -> None:
    # Unknown is not "no": in cluster mode, a stick that comes before the Node's labels waits.
    rig = Rig(target="site=line-3", node_labels=None, labels_later=later)

    report = await rig.run()

    assert rig.label_waits == 1
    waiting = [r for r in rig.reports if r.progress_text.startswith("waiting for the node's")]
    assert [(r.state, r.bundle_id) for r in waiting] == [("detected", BUNDLE_ID)]
    assert [s for s in rig.states() if s != "detected"] == states[1:]
    assert report.reason == reason


async def test_known_labels_or_no_selector_are_not_waited_for() -> None:
    for rig in (
        Rig(target="site=line-3", node_labels={"site": "line-3"}, labels_later=None),
        Rig(target=None, node_labels=None, labels_later=None),
    ):
        report = await rig.run()
        assert (report.state, rig.label_waits) == ("imported", 0)


@pytest.mark.parametrize(
    ("labels", "is_ignoring"),
    [({"site": "line-3", "zone": "a"}, False), (None, True), ({"site": "line-4"}, True)],
)
async def test_a_stick_for_this_node_or_imported_ignoring_its_target_is_imported(
    labels: Mapping[str, str] | None, is_ignoring: bool
) -> None:
    rig = Rig(target="site=line-3", node_labels=labels, is_ignoring_target=is_ignoring)

    report = await rig.run()

    assert rig.states() == ["detected", "verified", "admitted", "importing", "imported"]
    assert report.reason is None
    assert sorted(rig.crio.pull_calls) == [APP, DB]


async def test_blob_refused_by_the_server_rejects_the_bundle_after_the_pulls() -> None:
    rig = Rig()
    rig.server_rejections = (BundleDigestMismatch("blobs/sha256/4444 does not match its digest"),)

    report = await rig.run()

    assert rig.states()[-1] == "rejected"
    assert report.reason == "BundleDigestMismatch"
    assert rig.specs.files == {}
    assert "bundles" not in rig.store.docs
    assert rig.mirror.is_written is False


async def test_failed_reload_still_removes_the_mirror_and_closes_the_server() -> None:
    rig = Rig(reload_failures=1)

    with pytest.raises(RuntimeReloadFailed):
        await rig.run()

    assert rig.states() == ["detected", "verified", "admitted", "importing"]
    assert rig.crio.pull_calls == []
    assert (rig.mirror.is_written, rig.mirror.removals, rig.reloader.calls) == (False, 1, 2)
    assert rig.servers[0].calls == ["start", "close"]


# ---------------------------------------------------------------- anti-rollback, expiry
def newer(
    sequence: int = SEQUENCE + 10, channel: str = "default", format_version: int = 1
) -> Stamp:
    """An accepted bundle of the rig's key; of the rig's bundle's format (1) unless told."""
    return Stamp(
        KEY, channel, sequence, "sha256:" + "e" * 64, "line-3.newer", format_version=format_version
    )


async def test_an_older_format_after_a_newer_one_of_the_key_is_refused() -> None:
    rig = Rig(accepted=(newer(sequence=5, format_version=3),))  # a far lower sequence

    report = await rig.run()

    assert rig.states() == ["detected", "rejected"]
    assert report.reason == "BundleFormatDowngrade"
    assert "is format 1, older than bundle line-3.newer (format 3)" in (report.message or "")
    assert (rig.servers, rig.crio.pull_calls) == ([], [])


async def test_a_bundle_older_than_one_accepted_is_refused_before_anything() -> None:
    rig = Rig(accepted=(newer(),))

    report = await rig.run()

    assert rig.states() == ["detected", "rejected"]
    assert (report.reason, report.bundle_id) == ("BundleRollback", BUNDLE_ID)
    assert f"sequence {SEQUENCE}, lower than bundle line-3.newer" in (report.message or "")
    assert (rig.servers, rig.mirror.writes, rig.crio.pull_calls, rig.specs.files) == (
        [], [], [], {}
    )  # fmt: skip


@pytest.mark.parametrize(
    "accepted",
    [
        (newer(channel="apps"),),
        (Stamp("BEEF", "default", SEQUENCE + 10, "sha256:" + "e" * 64, "other-key"),),
        (Stamp(KEY, "default", SEQUENCE, DIGEST, BUNDLE_ID),),  # this very bundle, again
        (newer(SEQUENCE - 1),),
    ],
    ids=["other-channel", "other-key", "same-bundle", "older-accepted"],
)
async def test_a_bundle_not_older_in_its_key_and_channel_is_imported(
    accepted: tuple[Stamp, ...],
) -> None:
    report = await Rig(accepted=accepted).run()
    assert (report.state, report.reason) == ("imported", None)


async def test_by_hand_an_older_bundle_is_imported_and_the_warning_names_the_mark() -> None:
    rig = Rig(accepted=(newer(),), is_allowing_rollback=True)

    with capture_logs() as logs:
        report = await rig.run()

    assert report.state == "imported"
    [warning] = [e for e in logs if e["event"] == "bundle_rollback_allowed"]
    assert warning["log_level"] == "warning"
    assert (warning["bundle"], warning["sequence"]) == (BUNDLE_ID, SEQUENCE)
    assert (warning["high_water"], warning["high_water_bundle"]) == (SEQUENCE + 10, "line-3.newer")


async def test_an_expired_bundle_is_refused_and_imported_by_hand() -> None:
    expired_at = "2026-11-22T12:00:00Z"
    rig = Rig(wall_clock_s=NOW_S)
    rig.manifest_changes = {"formatVersion": 3, "sequence": 7, "expires": expired_at}
    report = await rig.run()
    assert (report.reason, rig.states()) == ("BundleExpired", ["detected", "rejected"])
    assert expired_at in (report.message or "")

    by_hand = Rig(wall_clock_s=NOW_S, is_allowing_expired=True)
    by_hand.manifest_changes = rig.manifest_changes
    with capture_logs() as logs:
        report = await by_hand.run()
    assert report.state == "imported"
    assert [e["expires"] for e in logs if e["event"] == "bundle_expiry_ignored"] == [expired_at]


async def test_the_import_from_the_store_is_judged_too() -> None:
    rig = Rig(accepted=(newer(),))
    report = await rig.importer.import_stored(
        manifest(), signed_by="factory", key_id_hex=KEY, digest=DIGEST, source="peers:x"
    )
    assert (report.state, report.reason) == ("rejected", "BundleRollback")
    assert rig.crio.pull_calls == []


async def test_a_registries_conf_nodeagent_cannot_read_rejects_before_any_pull() -> None:
    """The mirror drop-in restates registries.conf's entries (docs/decisions/0055): when the
    file cannot be read, no drop-in is written and the bundle is refused naming the file."""
    rig = Rig()

    def unreadable(_repositories: object, _mirror_host: str) -> bool:
        raise ConfigInvalid("/etc/containers/registries.conf: 'registry' must be an array")

    setattr(rig.mirror, "write", unreadable)  # noqa: B010  (the one failing port)
    report = await rig.run()

    assert (report.state, report.reason) == ("rejected", "ConfigInvalid")
    assert "registries.conf" in (report.message or "")
    assert rig.crio.pull_calls == []
    assert (rig.mirror.is_written, rig.reloader.calls) == (False, 0)
    assert rig.servers[0].calls == ["start", "close"]
    assert rig.specs.files == {}


def _release_bundle(rig: Rig, version: str, previous: list[str]) -> None:
    """The test bundle as a format 3 release bundle: APP its release image, ``apps`` its set."""
    rig.manifest_changes = {
        "formatVersion": 3,
        "sequence": SEQUENCE,
        "release": {
            "image": APP, "version": version, "set": "apps", "signatures": [],
            "previous": previous,
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    ("cluster", "version", "previous", "reason", "is_upgrade"),
    [
        ("4.16.3", "4.16.5", ["4.16.3"], "", True),
        ("4.16.3", "4.16.5", ["4.16.2"], "ReleaseNotAnUpgrade", False),
        ("4.16.6", "4.16.5", ["4.16.3"], "ReleaseNotAnUpgrade", False),  # a downgrade
        ("4.16.3", "4.16.5-x", [], "ReleaseNotAnUpgrade", False),
        (None, "4.16.5", [], "", False),  # the cluster's version not known: nothing judged
    ],
)
async def test_a_release_that_does_not_upgrade_the_cluster_is_imported_and_said(
    cluster: str | None, version: str, previous: list[str], reason: str, is_upgrade: bool
) -> None:
    """Item 2 of issue 26: loaded and pinned all the same, reported with both versions."""
    rig = Rig(cluster_version=cluster)
    _release_bundle(rig, version, previous)
    with structlog.testing.capture_logs() as logs:
        report = await rig.run()
    assert report.state == "imported"
    assert any("apps" in name for name in rig.specs.files)  # its sets handed over
    assert report.release is not None
    assert (report.release.path_reason, report.release.is_upgrade) == (reason, is_upgrade)
    said = [e for e in logs if e["event"] == "release_not_an_upgrade"]
    if reason:
        assert (reason, report.release.path_message) in report.warnings
        assert cluster is not None and cluster in report.release.path_message
        assert version in report.release.path_message
        assert said and said[0]["cluster_version"] == cluster and said[0]["release"] == version
    else:
        assert not said and not report.warnings
