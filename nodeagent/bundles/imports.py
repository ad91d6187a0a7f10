"""Bundles on removable media: udev says a medium arrived, it is mounted and imported.

One import at a time (a node has one runtime to feed); a medium removed during its
import cancels that import (``interrupted``: what is complete stays, the next plug-in
resumes), unless the importer already released it (the bundle is in the node's image
store and the import runs from there: the status said the medium may be removed). Each
import runs as a guarded one-off task: a failure (a mount refused, a bug) becomes a logged
reason code and a ``rejected`` bundle report in the status.

Ports (implemented in ``nodeagent.adapters.bundles``, wired by ``nodeagent.daemon``):
``MediaSource`` (udev), ``Mounter`` (mount(2) read-only) and ``Spawner`` (the daemon's
supervisor). The importer itself is built by a factory on the first medium, so a node
that never sees a stick never loads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from nodeagent.status import BundleReport
from nodeagent.strict import clip

if TYPE_CHECKING:
    from nodeagent.bundles.importer import Importer
from nodeagent.bundles.media import MediaEvent, MediaKind, mount_dir_name
from nodeagent.errors import BundleMediaRefused, BundleMediaRemoved, NodeAgentError

log = structlog.get_logger(__name__)


class MountedMedium(Protocol):
    @property
    def target(self) -> Path: ...

    def unmount(self, *, lazy: bool = False) -> None: ...


class Mounter(Protocol):
    """Mounts a medium read-only (blocking; run in a thread)."""

    def __call__(self, devnode: str, fs_type: str, target_dir: Path) -> MountedMedium: ...


class MediaSource(Protocol):
    """udev's view of bundle media: those present now, then arrivals and removals."""

    def existing(self) -> list[MediaEvent]: ...

    def __aiter__(self) -> AsyncIterator[MediaEvent]: ...


class Spawner(Protocol):
    def __call__(
        self,
        name: str,
        work: Coroutine[Any, Any, None],
        *,
        on_error: Callable[[str, str], None],
    ) -> asyncio.Task[None]: ...


ImporterFactory = Callable[[Callable[[Path], bool], Callable[[Path], None]], "Importer"]
"""Builds the importer, given how it asks whether its medium is still present and how it
says it no longer needs the medium."""


class MediaImports:
    """Imports media as udev reports them."""

    def __init__(
        self,
        *,
        media_dir: Path,
        make_importer: ImporterFactory,
        mount: Mounter,
        spawn: Spawner,
        report: Callable[[BundleReport], None],
        on_imported: Callable[[], None],
    ) -> None:
        self.media_dir = media_dir
        self.make_importer = make_importer
        self.mount = mount
        self.spawn = spawn
        self.report = report
        self.on_imported = on_imported
        self.present: set[str] = set()
        self.roots: dict[Path, str] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.released: set[asyncio.Task[None]] = set()
        self.removed: set[asyncio.Task[None]] = set()
        """Imports cancelled because their medium went away (not because the daemon stops)."""
        """Imports that no longer read their medium (their bundle is stored)."""
        self.lock = asyncio.Lock()
        self._importer: Importer | None = None

    @property
    def importer(self) -> Importer:
        if self._importer is None:
            self._importer = self.make_importer(self.is_present, self.release)
        return self._importer

    def is_present(self, root: Path) -> bool:
        return self.roots.get(root) in self.present

    def release(self, root: Path) -> None:
        """The import of the medium mounted at ``root`` no longer needs it."""
        running = self.tasks.get(self.roots.get(root, ""))
        if running is not None:
            self.released.add(running)

    async def follow(self, source: MediaSource) -> None:
        """Import the media present now, then every medium that arrives."""
        for event in source.existing():
            self.on_event(event)
        async for event in source:
            self.on_event(event)

    def on_event(self, event: MediaEvent) -> None:
        if event.kind is MediaKind.REFUSED:
            self._refused(event)
            return
        if event.kind is MediaKind.ARRIVED:
            was_present = event.devnode in self.present
            self.present.add(event.devnode)
            running = self.tasks.get(event.devnode)
            # A removal just cancelled the device's import, which is still giving up (removing
            # its mirror), or one that runs from the store: the medium in the device now
            # (swapped, plugged in again) is new.
            if (
                running is None
                or running.done()
                or running.cancelling()
                or (running in self.released and not was_present)
            ):
                task = self.spawn(
                    f"import {event.devnode}",
                    self._import(event),
                    on_error=lambda reason, message: self._failed(event, reason, message),
                )
                self.tasks[event.devnode] = task
                task.add_done_callback(lambda done: self._forget(event.devnode, done))
            return
        self.present.discard(event.devnode)
        running = self.tasks.get(event.devnode)
        is_released = running in self.released
        log.info(
            "bundle_media_removed",
            device=event.devnode,
            label=event.label,
            is_import_going_on=is_released,
        )
        if running is not None and not is_released:
            self.removed.add(running)
            running.cancel()

    def _forget(self, devnode: str, done: asyncio.Task[None]) -> None:
        self.released.discard(done)
        self.removed.discard(done)
        if self.tasks.get(devnode) is done:  # not the import of a medium that came after
            del self.tasks[devnode]

    async def _import(self, event: MediaEvent) -> None:
        async with self.lock:
            target = self.media_dir / mount_dir_name(event)
            log.info(
                "bundle_media_detected", device=event.devnode, label=event.label, fs=event.fs_type
            )
            mounted = await self._mount(event, target)
            self.roots[mounted.target] = event.devnode
            try:
                report = await self.importer.import_bundle(mounted.target, source=event.devnode)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current in self.removed:
                    self.removed.discard(current)
                    self._interrupted(event)
                else:
                    log.info(
                        "bundle_import_stopped",
                        device=event.devnode,
                        message="the daemon is stopping; the import resumes when it starts again",
                    )
                raise
            finally:
                self.roots.pop(mounted.target, None)
                await _unmount(mounted, event)
            if report.state == "imported":
                self.on_imported()

    async def _mount(self, event: MediaEvent, target: Path) -> MountedMedium:
        """Mount in a thread; cancelled meanwhile, undo the mount the thread still makes.

        A mount left behind would make the next plug-in of the medium fail (the mount
        point is in use).
        """
        mounting = asyncio.ensure_future(
            asyncio.to_thread(self.mount, event.devnode, event.fs_type, target)
        )
        try:
            return await asyncio.shield(mounting)
        except asyncio.CancelledError:
            try:
                late = await mounting
            except (NodeAgentError, OSError):  # the mount failed: nothing to undo
                raise asyncio.CancelledError from None
            await _unmount(late, event)
            raise

    def _interrupted(self, event: MediaEvent) -> None:
        gone = BundleMediaRemoved(
            f"{event.devnode} ({event.label}) was removed during the import; the images already "
            "in the runtime stay; plug it in again to finish"
        )
        log.warning(
            "bundle_interrupted", device=event.devnode, reason=gone.reason, error=gone.message
        )
        self.report(
            BundleReport(event.devnode, "interrupted", reason=gone.reason, message=gone.message)
        )

    def _refused(self, event: MediaEvent) -> None:
        """A labelled medium nodeagent does not mount (the tracker reports it once per plug-in):
        one warning naming it and why, and a ``rejected`` report in the status."""
        refused = BundleMediaRefused(
            f"{event.devnode} (label {clip(event.label, 64)}, {clip(event.fs_type, 32)}, bus "
            f"{event.bus}) was not mounted: {event.refusal}"
        )
        log.warning(
            "bundle_media_refused",
            device=event.devnode,
            label=clip(event.label, 64),
            fs=clip(event.fs_type, 32),
            bus=event.bus,
            reason=refused.reason,
            error=refused.message,
        )
        self.report(
            BundleReport(event.devnode, "rejected", reason=refused.reason, message=refused.message)
        )

    def _failed(self, event: MediaEvent, reason: str, message: str) -> None:
        """The import task failed (the supervisor logged it): the status says why."""
        self.report(BundleReport(event.devnode, "rejected", reason=reason, message=message))


async def _unmount(mounted: MountedMedium, event: MediaEvent) -> None:
    """Detach the medium's mount; one that stays is said (the next plug-in of the medium
    would find its mount point in use), never passed over."""
    try:
        await asyncio.to_thread(mounted.unmount, lazy=True)
    except NodeAgentError as err:
        log.error(
            "media_not_unmounted",
            device=event.devnode,
            target=str(mounted.target),
            reason=err.reason,
            error=err.message,
        )
