"""An import's mirror session: its blobs served on loopback, its missing images pulled.

``MirrorImport.pull`` serves a bundle's files (from its medium, or from the node's store)
on loopback for one mirror session (``serving.MIRROR_LOCK``), pulls the images the runtime
lacks through a registries.conf mirror pointing at the server, reports the bytes as they
are served, and judges the outcome: a blob that failed its digest refuses the bundle; a
pull that failed while the medium was removed interrupts it.

With ``copying`` (an import from a medium into the node's store), the session starts with
the copy rather than after it (decision 0079), so the runtime's pulls run while the medium
is read. An image's pull starts once every blob it needs is stored (``arrivals``, decision
0081); the server still awaits a blob not stored yet (``ARRIVAL_WAIT_S``). The copy's own
reports come first (storing, stored); the pulls are reported once it is done. A refused
copy lets the pulls under way end (their blobs are all stored), starts no other, then
takes back the images they brought in and the blobs it stored: a refused bundle leaves
nothing behind. A cancelled copy ends the pulls and their server at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import structlog

from nodeagent.bundles.arrivals import ArrivalGate
from nodeagent.bundles.import_ports import ImporterPorts
from nodeagent.bundles.manifest import BundleError, BundleManifest, ExpectedFile
from nodeagent.bundles.mirror import served_blobs, total_size_bytes
from nodeagent.bundles.serving import (
    MIRROR_LOCK,
    BundleServerPort,
    MirrorPullPorts,
    pull_via_mirror,
    reading_signatures,
)
from nodeagent.bundles.tags import answered_tags
from nodeagent.errors import (
    BundleMediaRemoved,
    BundleServerFailed,
    ConfigInvalid,
    NodeAgentError,
)
from nodeagent.prepull import Held, PullResult
from nodeagent.progress import DEFAULT_INTERVAL_S, ByteProgress, ProgressMeter
from nodeagent.status import BundleReport
from nodeagent.units import format_bytes

log = structlog.get_logger(__name__)

ARRIVAL_WAIT_S: Final = 1800
"""How long the import's loopback server awaits a blob its store copy has not brought in
yet (decision 0079). The copy of a whole release from a slow stick takes minutes (16 GiB at
20 MB/s: 14 min); a blob still absent after this is refused as missing, and the import
with it. A refused or cancelled copy ends the pulls at once, whatever is awaited."""


def missing_bytes(manifest: BundleManifest, missing: Sequence[str]) -> int:
    """Bytes to bring in: every blob when nothing is stored yet, else the missing images' sizes
    (conservative: blobs they share with stored images count again)."""
    if len(missing) == len(manifest.images):
        return total_size_bytes(served_blobs(manifest))
    wanted = set(missing)
    return sum(image.size_bytes for image in manifest.images if str(image.ref) in wanted)


Copying = Callable[[Callable[[], None], Callable[[str], None]], Coroutine[Any, Any, BundleReport]]
"""The store's copy from the medium, given what it calls (from its threads) once admitted
and with each blob it stored."""


class MirrorImport:
    """The mirror sessions of one importer; reports go through the importer's callbacks."""

    def __init__(
        self,
        ports: ImporterPorts,
        *,
        said: Callable[..., BundleReport],
        refuse: Callable[[BundleReport, NodeAgentError], BundleReport],
        show: Callable[[BundleReport, ByteProgress], None],
    ) -> None:
        self.ports = ports
        self._said = said
        """``Importer._report``: log the event and report the state."""
        self._refuse = refuse
        self._show = show

    async def pull(
        self,
        source: Path,
        files: Mapping[str, ExpectedFile],
        manifest: BundleManifest,
        missing: Sequence[str],
        report: BundleReport,
        *,
        copying: Copying | None = None,
    ) -> BundleReport:
        """Serve ``files`` from ``source`` and pull ``missing`` through the mirror, one
        mirror session at a time (``serving.MIRROR_LOCK``).

        With ``copying`` (the store's copy from the medium, whose report it returns), the
        session starts once the copy is admitted (the medium's manifest verified again, the
        store's cap and free space checked), and the copy goes on meanwhile: the server
        awaits each blob not copied yet. The pulls are reported once the copy is (storing,
        stored, then importing). A refused copy ends the pulls, takes back the images they
        brought in, and is the outcome."""
        if copying is None:
            return await self._session(source, files, manifest, missing, report, copy=None)
        loop = asyncio.get_running_loop()
        admitted = asyncio.Event()
        store = self.ports.image_store
        arrivals = None if store is None else ArrivalGate(store, self.ports.platform)

        def on_admitted() -> None:  # in the copy's thread
            loop.call_soon_threadsafe(admitted.set)

        def on_stored(digest: str) -> None:  # in the copy's commit thread
            if arrivals is not None:
                loop.call_soon_threadsafe(arrivals.stored, digest)

        copy = asyncio.create_task(copying(on_admitted, on_stored))
        try:
            gate = asyncio.create_task(admitted.wait())
            await asyncio.wait({copy, gate}, return_when=asyncio.FIRST_COMPLETED)
            await _ended(gate)
            if copy.done():  # refused before its first blob, or done already
                copied = copy.result()
                if copied.state == "rejected":
                    return copied
                return await self._session(source, files, manifest, missing, copied, copy=None)
            return await self._session(
                source, files, manifest, missing, report, copy=copy, arrivals=arrivals
            )
        finally:
            await _ended(copy)

    async def _session(
        self,
        source: Path,
        files: Mapping[str, ExpectedFile],
        manifest: BundleManifest,
        missing: Sequence[str],
        report: BundleReport,
        *,
        copy: asyncio.Task[BundleReport] | None,
        arrivals: ArrivalGate | None = None,
    ) -> BundleReport:
        """One mirror session; with ``copy`` running, its report is awaited before the
        pulls are reported (and a refused copy is the outcome); ``arrivals`` holds each
        image back until the copy stored its blobs."""
        async with MIRROR_LOCK:
            server = self._server(source, files, manifest)
            try:
                await server.start()
            except BundleServerFailed as exc:  # its process could not be had: nothing pulled
                if copy is not None:  # the medium is stored all the same, for a retry
                    report = await copy
                return report if report.state == "rejected" else self._refuse(report, exc)
            ready = None if arrivals is None else arrivals.ready
            pulls = asyncio.create_task(self._pulled(server, manifest, missing, ready))
            try:
                if copy is not None:
                    report = await copy
                    if report.state == "rejected":
                        return await self._called_off(pulls, arrivals, missing, report)
                    if arrivals is not None:
                        arrivals.end(None)
                return await self._reported_pulls(
                    pulls, server, source=source, manifest=manifest, missing=missing, report=report
                )
            finally:
                await _ended(pulls)

    async def _called_off(
        self,
        pulls: asyncio.Task[Mapping[str, PullResult]],
        arrivals: ArrivalGate | None,
        missing: Sequence[str],
        report: BundleReport,
    ) -> BundleReport:
        """The copy was refused: with ``arrivals``, the pulls under way end (every blob
        they need is stored) and no other starts; without, they are ended at once. Then
        the images they brought in, and the blobs the copy stored, are taken back."""
        if arrivals is None:
            await _ended(pulls)
        else:
            arrivals.end(Held(report.reason or "", report.message or ""))
            await asyncio.gather(pulls, return_exceptions=True)
        await self._take_back(missing, report)
        store = self.ports.image_store
        if arrivals is not None and store is not None and arrivals.arrived:
            try:
                count, freed = await asyncio.to_thread(store.discard, arrivals.arrived)
            except NodeAgentError as err:
                log.warning("bundle_blobs_not_removed", bundle=report.bundle_id,
                            reason=err.reason, error=err.message)  # fmt: skip
            else:
                if count:
                    log.info("bundle_blobs_removed", bundle=report.bundle_id, blobs=count,
                             freed=format_bytes(freed))  # fmt: skip
        return report

    async def _take_back(self, missing: Sequence[str], report: BundleReport) -> None:
        """Remove from the runtime the images of ``missing`` the pulls brought in before the
        copy was refused: a refused bundle leaves no image behind (none of its sets was
        applied, so none is pinned). One that cannot be removed is said and left."""
        runtime = self.ports.runtime
        removed = 0
        for ref in missing:
            try:
                if await runtime.image_status(ref) is None:
                    continue
                await runtime.remove_image(ref)
                removed += 1
            except NodeAgentError as err:
                log.warning(
                    "bundle_image_not_removed", bundle=report.bundle_id, image=ref,
                    reason=err.reason, error=err.message,
                )  # fmt: skip
        if removed:
            log.info("bundle_images_removed", bundle=report.bundle_id, images=removed)

    async def _pulled(
        self,
        server: BundleServerPort,
        manifest: BundleManifest,
        missing: Sequence[str],
        ready: Callable[[str], Awaitable[Held | None]] | None = None,
    ) -> Mapping[str, PullResult]:
        """The pulls of a started ``server``'s session; it is closed whatever happens."""
        session = MirrorPullPorts(
            self.ports.runtime,
            self.ports.mirror,
            self.ports.reloader,
            self.ports.make_puller,
            is_probing=self.ports.is_probing_mirror,
        )
        sigstore = self.ports.sigstore if manifest.image_signatures else None
        is_pulling = False  # pull_via_mirror closes the server once it began
        try:
            async with reading_signatures(sigstore, server.mirror_host):
                is_pulling = True
                return await pull_via_mirror(
                    session, server, (i.ref for i in manifest.images), missing,
                    source="bundle", tags=manifest.served_tags, ready=ready,
                )  # fmt: skip
        finally:
            if not is_pulling:
                await server.close()

    async def _reported_pulls(
        self,
        pulls: asyncio.Task[Mapping[str, PullResult]],
        server: BundleServerPort,
        *,
        source: Path,
        manifest: BundleManifest,
        missing: Sequence[str],
        report: BundleReport,
    ) -> BundleReport:
        """The running ``pulls``' progress every 2 s, then their outcome."""
        importing = replace(report, state="importing")
        total = missing_bytes(manifest, missing)
        self._said(importing, "bundle_importing", images=len(missing), bytes=format_bytes(total))
        ticker = asyncio.create_task(self._serving_progress(server, importing, total))
        try:
            results = await pulls
        except ConfigInvalid as exc:
            # registries.conf cannot be read, so the mirror drop-in (which restates its
            # entries) was not written and nothing was pulled: the file must be fixed.
            return self._refuse(replace(importing, progress=None), exc)
        finally:
            ticker.cancel()
        pulled = sum(1 for r in results.values() if r.is_pulled)
        after = replace(
            importing,
            images_present=report.images_present + pulled,
            bytes_served=server.bytes_served(),
            progress=None,
        )
        medium = None if self.ports.image_store is not None else source  # stored: no medium
        return self._outcome(medium, after, server.rejections, results.values())

    def _server(
        self, source: Path, files: Mapping[str, ExpectedFile], manifest: BundleManifest
    ) -> BundleServerPort:
        """The loopback server; for a bundle with image signatures or served tags, one that
        answers those tags (and no other)."""
        make_signed = self.ports.make_signed_server
        tags = answered_tags(manifest.image_signatures, manifest.served_tags)
        if tags and make_signed is not None:
            return make_signed(source, files, tags)
        return self.ports.make_server(source, files)

    async def _serving_progress(
        self, server: BundleServerPort, report: BundleReport, total: int
    ) -> None:
        """The import's bytes (what the runtime fetched from the server) every 2 s."""
        meter = ProgressMeter(total, time.monotonic())
        served = 0
        while True:
            await asyncio.sleep(DEFAULT_INTERVAL_S)
            now = server.bytes_served()
            shown = meter.advance(now - served, time.monotonic())
            served = now
            if shown is not None:
                self._show(replace(report, bytes_served=now), shown)

    def _outcome(
        self,
        medium: Path | None,
        report: BundleReport,
        rejections: Sequence[BundleError],
        results: Iterable[PullResult],
    ) -> BundleReport:
        if rejections:
            return self._refuse(report, rejections[0])
        failed = [r for r in results if not r.is_pulled]
        if not failed:
            return report
        if medium is not None and not self.ports.is_present_on_media(medium):
            gone = BundleMediaRemoved(
                f"the medium was removed during the import; {report.images_present} of "
                f"{report.images_total} images are in the runtime and stay; plug it in again "
                "to finish"
            )
            interrupted = replace(
                report, state="interrupted", reason=gone.reason, message=gone.message
            )
            return self._said(interrupted, "bundle_interrupted")
        first = failed[0]
        return self._said(
            replace(report, state="rejected", reason=first.reason, message=first.message),
            "bundle_rejected",
            image=first.ref,
        )


async def _ended(task: asyncio.Task[object]) -> None:
    """Cancel ``task`` unless it is done, and wait for it to end (its outcome dropped: the
    caller's is the one that counts)."""
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)
