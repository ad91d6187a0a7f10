"""Import an upgrade bundle into the runtime without any network registry, then hand over its sets.

Steps, each reported (journal event and status): detected -> verified (signature
by a trusted key, then the tree) -> admitted (disk, from the manifest's exact
sizes: the store's copy and the unpacked images together) -> storing (every blob
the node's image store lacks copied from the medium in one pass, hashed while
copied) -> stored (the medium may be removed) -> importing (the bundle served
read-only on loopback from the store, the runtime
pointed at it by a registries.conf mirror, every missing image pulled by its
original name through CRI, so the runtime's own digest checks apply). The pulls
start with the copy, not after it: the server awaits each blob until the copy has
stored it (decision 0079), and the status shows the pulls once the copy is done ->
imported (the bundle's PinnedImageSets written to the spec directories; the
regular sync pins them) | rejected (with its reason) | interrupted (medium
removed: what is complete stays, the next plug-in resumes).

A blob that fails its digest never reaches the runtime whole, and then none of
the bundle's sets are applied.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import structlog

from nodeagent.bundles.freshness import check
from nodeagent.bundles.handover import hand_over, was_imported
from nodeagent.bundles.import_ports import ImageStorePort, ImporterPorts
from nodeagent.bundles.manifest import BundleManifest
from nodeagent.bundles.mirror import served_blobs, total_size_bytes
from nodeagent.bundles.mirror_import import MirrorImport, missing_bytes
from nodeagent.bundles.release import next_steps
from nodeagent.bundles.signatures import AttachmentScopes, sigstore_findings
from nodeagent.bundles.target import check_node_in_target, describe_target
from nodeagent.disk import DiskPolicy, admit, needed_bytes, reserve_for
from nodeagent.errors import (
    BundleMediaRemoved as BundleMediaRemoved,
)
from nodeagent.errors import (
    InsufficientDiskSpace,
    NodeAgentError,
)
from nodeagent.ports import FilesystemSpace
from nodeagent.progress import ByteProgress
from nodeagent.releases import release_report
from nodeagent.status import BundleReport, ReleaseReport
from nodeagent.strict import clip
from nodeagent.units import format_bytes

log = structlog.get_logger(__name__)

MESSAGE_CHARS = 1000
"""A refusal's message in the status and the journal is clipped to this (escaped)."""


# ---------------------------------------------------------------- service
class Importer:
    """Imports one bundle at a time (the daemon serializes calls)."""

    def __init__(self, ports: ImporterPorts, disk: DiskPolicy) -> None:
        self.ports = ports
        self.disk = disk
        self._mirror = MirrorImport(
            ports, said=self._report, refuse=self._reject, show=self._progress
        )

    def _report(self, report: BundleReport, event: str, **fields: object) -> BundleReport:
        level = "error" if report.state == "rejected" else "info"
        extra = {"reason": report.reason, "error": report.message} if report.reason else {}
        getattr(log, level)(event, bundle=report.bundle_id or report.source, **fields, **extra)
        self.ports.on_report(report)
        return report

    async def import_bundle(self, root: Path, *, source: str) -> BundleReport:
        report = self._report(BundleReport(source, "detected"), "bundle_detected", path=str(root))
        try:
            checked = await asyncio.to_thread(self.ports.verify, root)
        except NodeAgentError as exc:
            return self._reject(report, exc)
        manifest = checked.manifest
        if manifest.target is not None and self.ports.is_ignoring_target:
            log.warning(
                "bundle_target_ignored",
                bundle=manifest.bundle_id,
                selector=manifest.target.selector_text,
                action="imported by hand with --ignore-target",
            )
        elif manifest.target is not None:
            labels = await self._node_labels(replace(report, bundle_id=manifest.bundle_id))
            try:
                check_node_in_target(manifest.target, labels, bundle_id=manifest.bundle_id)
            except NodeAgentError as exc:
                return self._reject(replace(report, bundle_id=manifest.bundle_id), exc)
        stale = await self._stale(
            manifest, checked.key_id_hex, checked.manifest_digest, checked.linked
        )
        if stale is not None:
            return self._reject(replace(report, bundle_id=manifest.bundle_id), stale)
        report = replace(
            report,
            state="verified",
            bundle_id=manifest.bundle_id,
            signed_by=checked.signed_by,
            images_total=len(manifest.images),
            bytes_total=total_size_bytes(served_blobs(manifest)),
        )
        self._report(
            report,
            "bundle_verified",
            key=checked.signed_by,
            target=describe_target(manifest.architecture, manifest.target),
        )
        return await self._import_verified(root, manifest, report)

    async def _node_labels(self, report: BundleReport) -> Mapping[str, str] | None:
        labels, wait = self.ports.node_labels(), self.ports.wait_node_labels
        if labels is not None or wait is None:
            return labels
        waiting = replace(report, progress_text="waiting for the node's labels from the API")
        self._report(waiting, "bundle_waiting_for_labels")
        return await wait()

    async def import_stored(
        self,
        manifest: BundleManifest,
        *,
        signed_by: str,
        key_id_hex: str,
        digest: str,
        source: str,
        linked: tuple[str, ...] = (),
    ) -> BundleReport:
        """A bundle already in the store (fetched from peers, its signature verified and its
        target checked by the fetcher): import and hand over as after a stick's copy, unless
        the anti-rollback rule refuses it now (a newer one came meanwhile)."""
        total = total_size_bytes(served_blobs(manifest))
        report = BundleReport(
            source, "stored", manifest.bundle_id, signed_by, len(manifest.images), bytes_total=total
        )
        stale = await self._stale(manifest, key_id_hex, digest, linked)
        if stale is not None:
            return self._reject(report, stale)
        return await self._import_verified(None, manifest, report)

    async def _stale(
        self, manifest: BundleManifest, key_id_hex: str, digest: str, linked: tuple[str, ...] = ()
    ) -> NodeAgentError | None:
        """Expiry and anti-rollback (``bundles.freshness.check``): the refusal, or None to go
        on; a rule set aside by hand is logged as a warning naming what it let in."""
        ports, bundle_id, sequence = self.ports, manifest.bundle_id, manifest.sequence
        candidate = manifest.stamp(key_id_hex, digest, linked)
        checked = check(
            candidate, manifest.expires, await asyncio.to_thread(ports.accepted),
            dt.datetime.fromtimestamp(ports.wall_clock(), dt.UTC),
            is_allowing_rollback=ports.is_allowing_rollback,
            is_allowing_expired=ports.is_allowing_expired,
        )  # fmt: skip
        if checked.is_expiry_ignored:
            log.warning("bundle_expiry_ignored", bundle=bundle_id, expires=manifest.expires,
                        action="imported by hand with --allow-expired")  # fmt: skip
        if (mark := checked.passed_mark) is not None:
            log.warning(
                "bundle_rollback_allowed", bundle=bundle_id, key=key_id_hex,
                channel=manifest.channel, sequence=sequence, high_water=mark.sequence,
                high_water_bundle=mark.bundle_id, action="imported by hand with --allow-rollback",
            )  # fmt: skip
        return checked.refusal

    def _with_space_note(
        self, manifest: BundleManifest, exc: InsufficientDiskSpace
    ) -> InsufficientDiskSpace:
        """A release bundle refused for space says which releases hold it and when they go."""
        note = self.ports.space_note() if manifest.release is not None else ""
        return InsufficientDiskSpace(f"{exc.message}; {note}") if note else exc

    def _reject(self, report: BundleReport, exc: NodeAgentError) -> BundleReport:
        message = clip(exc.message, MESSAGE_CHARS)
        rejected = replace(report, state="rejected", reason=exc.reason, message=message)
        return self._report(rejected, "bundle_rejected")

    async def _import_verified(
        self, root: Path | None, manifest: BundleManifest, report: BundleReport
    ) -> BundleReport:
        """From ``root`` (a medium), or from the store alone (``root`` None)."""
        if manifest.release is not None:
            steps = tuple(next_steps(manifest.release, manifest.bundle_id))
            report = replace(report, next_steps=steps, release=self._release_report(manifest))
        frozen = tuple((t.reference, t.image.digest) for t in manifest.served_tags)
        report = replace(report, frozen_tags=frozen)
        refs = [str(image.ref) for image in manifest.images]
        missing = [ref for ref in refs if await self.ports.runtime.image_status(ref) is None]
        report = replace(report, images_present=len(refs) - len(missing))
        store = self.ports.image_store
        to_store = 0 if store is None else await asyncio.to_thread(store.missing_bytes, manifest)
        if not missing and not to_store and was_imported(self.ports.store, manifest.bundle_id):
            done = replace(report, state="imported", is_already_imported=True)
            return self._report(done, "bundle_already_imported", images=len(refs))
        try:
            await self._admit(manifest, missing, report, to_store)
        except InsufficientDiskSpace as exc:
            return self._reject(report, self._with_space_note(manifest, exc))
        report = await self._bring_in(
            store, root, manifest, missing=missing, report=report, to_store=to_store
        )
        if report.state in ("rejected", "interrupted"):
            return report
        warnings = (*_path_warning(report.release), *await self._sigstore_warnings(manifest))
        return self._hand_over(manifest, replace(report, warnings=warnings))

    async def _bring_in(
        self,
        store: ImageStorePort | None,
        root: Path | None,
        manifest: BundleManifest,
        *,
        missing: Sequence[str],
        report: BundleReport,
        to_store: int,
    ) -> BundleReport:
        """The store's copy from ``root`` (a medium; None: the store holds the bundle) and
        the pulls of ``missing``, side by side when both run (decision 0079)."""
        if store is None:
            if root is None:
                raise ValueError("a bundle without a medium is imported from the store")
            if not missing:
                return report
            return await self._mirror.pull(root, served_blobs(manifest), manifest, missing, report)
        if root is not None and not missing:
            return await self._store(store, root, manifest, report, to_store=to_store)
        if not missing:
            return report
        files = store.served_files(manifest)
        if root is None:
            return await self._mirror.pull(store.root, files, manifest, missing, report)
        medium = root

        async def copying(
            on_admitted: Callable[[], None], on_stored: Callable[[str], None]
        ) -> BundleReport:
            return await self._store(
                store, medium, manifest, report, to_store=to_store,
                on_admitted=on_admitted, on_stored=on_stored,
            )  # fmt: skip

        return await self._mirror.pull(
            store.root, files, manifest, missing, report, copying=copying
        )

    async def _store(
        self,
        store: ImageStorePort,
        root: Path,
        manifest: BundleManifest,
        report: BundleReport,
        *,
        to_store: int,
        on_admitted: Callable[[], None] = lambda: None,
        on_stored: Callable[[str], None] = lambda _digest: None,
    ) -> BundleReport:
        """Copy what the store lacks from the medium; then the medium may be removed.

        The copy runs even when the store holds every blob: it records the bundle (its
        signed manifest, signature and record), without which the store would not keep
        its blobs for it nor serve its tags (a newer bundle of the same images).
        ``on_admitted`` is called (in the copy's thread) once it passed its checks,
        ``on_stored`` (in its commit thread) with each blob it stored.
        """
        carries_files = manifest.release is not None and bool(manifest.release.signatures)
        is_shown = bool(to_store or carries_files)  # a release's signature files are copied
        storing = replace(report, state="storing")
        if is_shown:
            self._report(storing, "bundle_storing", bytes=format_bytes(to_store))
        loop = asyncio.get_running_loop()
        is_cancelled = False
        stop = threading.Event()  # the copy's thread stops at its next chunk once set

        def show(progress: ByteProgress) -> None:  # on the loop, after any cancellation
            if is_shown and not is_cancelled:
                self._progress(storing, progress)

        def on_progress(progress: ByteProgress) -> None:
            loop.call_soon_threadsafe(show, progress)

        try:
            copy = functools.partial(
                store.copy, root, manifest, on_progress, stop.is_set,
                on_admitted=on_admitted, on_stored=on_stored,
            )  # fmt: skip
            await asyncio.to_thread(copy)
        except InsufficientDiskSpace as exc:
            return self._reject(
                replace(report, progress=None), self._with_space_note(manifest, exc)
            )
        except NodeAgentError as exc:
            return self._reject(replace(report, progress=None), exc)
        except asyncio.CancelledError:
            # The copy's thread stops at its next chunk, storing and recording nothing more
            # (a medium still readable after its removal was reported would otherwise be
            # copied whole and recorded, yet never imported); until then its progress must
            # not overwrite the report that says the import stopped.
            is_cancelled = True
            stop.set()
            raise
        self.ports.release_medium(root)
        stored = replace(report, state="stored", is_medium_removable=True, progress=None)
        # The line leads with its catalog summary: "...: the medium may be removed."
        return self._report(stored, "bundle_stored", bytes=format_bytes(to_store))

    def _progress(self, report: BundleReport, progress: ByteProgress) -> None:
        """A step's bytes for the status file and STATUS= (the reporter paces nothing more:
        the meter gives one at most every 2 s)."""
        self.ports.on_report(
            replace(report, progress=progress.to_json(), progress_text=progress.describe())
        )

    async def _admit(
        self, manifest: BundleManifest, missing: Sequence[str], report: BundleReport, to_store: int
    ) -> None:
        """The unpacked images, plus the store's copy when both share a filesystem (the store
        checks its own filesystem and size cap again before its first byte)."""
        filesystems = await self.ports.runtime.image_fs_info()
        mountpoint = filesystems[0].mountpoint if filesystems else "/"
        space: FilesystemSpace = await asyncio.to_thread(self.ports.space.space, mountpoint)
        reserve = reserve_for(space.total_bytes, self.disk.reserve_bytes, self.disk.reserve_percent)
        need = needed_bytes(missing_bytes(manifest, missing), self.disk.expansion_factor)
        store = self.ports.image_store
        shares = store is not None and to_store > 0
        if shares and store is not None:
            shares = await asyncio.to_thread(store.shares_filesystem, mountpoint)
        need += to_store if shares else 0
        verdict = admit(need, space, reserve)
        if not verdict.is_admitted:
            raise InsufficientDiskSpace(
                f"bundle {manifest.bundle_id} {verdict.describe()}; nothing was copied"
            )
        self._report(
            replace(report, state="admitted"),
            "bundle_admitted",
            needed=format_bytes(need),
            available=format_bytes(space.available_bytes),
            reserve=format_bytes(reserve),
        )

    def _hand_over(self, manifest: BundleManifest, report: BundleReport) -> BundleReport:
        names = hand_over(self.ports.specs, self.ports.store, manifest)
        done = replace(
            report, state="imported", images_present=report.images_total, sets=tuple(names)
        )
        return self._report(done, "bundle_imported", images=report.images_total, sets=names)

    def _release_report(self, manifest: BundleManifest) -> ReleaseReport | None:
        """The release and the upgrade-path check against the cluster's version: a release
        that does not upgrade it is still imported and pinned, and said (decision 0066)."""
        carried = manifest.release
        if carried is None:
            return None
        report = release_report(
            carried.version, carried.image.digest, carried.set_name, carried.previous,
            self.ports.cluster_version(),
        )  # fmt: skip
        if not report.path_reason:
            return report
        log.warning(
            "release_not_an_upgrade", bundle=manifest.bundle_id, release=carried.version,
            cluster_version=report.cluster_version, reason=report.path_reason,
            error=report.path_message,
            action="the release is pinned but will not be proposed as the cluster's next version",
        )  # fmt: skip
        return report

    async def _sigstore_warnings(self, manifest: BundleManifest) -> tuple[tuple[str, str], ...]:
        """Signed images whose signatures CRI-O would not read (registries.d), logged."""
        sigstore = self.ports.sigstore
        if sigstore is None or not manifest.image_signatures:
            return ()
        try:
            scopes = await asyncio.to_thread(sigstore.scopes)
        except NodeAgentError as exc:
            scopes = AttachmentScopes(problems=(exc.message,))
        findings = sigstore_findings(
            manifest.image_signatures, scopes, directory=sigstore.directory
        )
        for found in findings:
            log.warning(
                "bundle_signatures_unread", bundle=manifest.bundle_id, subject=found.subject,
                reason=found.code, error=found.message, action=found.action,
            )  # fmt: skip
        return tuple((f.code, clip(f"{f.message}; {f.action}", MESSAGE_CHARS)) for f in findings)


def _path_warning(release: ReleaseReport | None) -> tuple[tuple[str, str], ...]:
    if release is None or not release.path_reason:
        return ()
    return ((release.path_reason, clip(release.path_message, MESSAGE_CHARS)),)
