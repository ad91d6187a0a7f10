"""Wiring of bundle imports: the importer with its adapters, the media loop, and ``bundle import``.

Kept apart from ``daemon.py`` (which runs the pin/pre-load loop) so each stays short; both are
part of the composition root: they build adapters and hand them to domain services.

The daemon imports this module at start, so it stays light: the importer and its
adapters (``bundles_build``) load when the first medium arrives, the udev watcher when
the media loop starts (``bundles.watch_media``), the mount code with the first mount.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from nodeagent.bundles.media import MediaEvent, MediaKind, mount_dir_name
from nodeagent.config import Config

if TYPE_CHECKING:
    from nodeagent.adapters.bundles.mount import Mount
    from nodeagent.adapters.cri.client import CriClient
    from nodeagent.bundles.importer import BundleReport, Importer
    from nodeagent.pins import Reloader

log = structlog.get_logger(__name__)

MAX_REPORTS = 10
"""Bundles kept in the status (the most recent)."""


@dataclass
class BundleBoard:
    """The latest report per bundle source, for the status file."""

    reports: dict[str, BundleReport] = field(default_factory=dict)
    on_change: Callable[[], None] = lambda: None

    def update(self, report: BundleReport) -> None:
        self.reports[report.source] = report
        while len(self.reports) > MAX_REPORTS:
            self.reports.pop(next(iter(self.reports)))
        self.on_change()

    def mark_pinned(self, pinned_sets: set[str]) -> None:
        """An imported bundle whose sets are all pinned is done: state ``pinned``."""
        for source, report in list(self.reports.items()):
            if report.state == "imported" and set(report.sets) <= pinned_sets:
                self.reports[source] = replace(report, state="pinned")
                log.info("bundle_pinned", bundle=report.bundle_id, sets=list(report.sets))

    def to_json(self) -> list[dict[str, object]]:
        return [report.to_json() for report in self.reports.values()]


def build_importer(
    config: Config,
    cri: CriClient,
    reloader: Reloader,
    *,
    on_report: Callable[[BundleReport], None],
    is_present: Callable[[Path], bool] = lambda root: root.exists(),
) -> Importer:
    """The importer with its adapters; their modules load on the first call."""
    from nodeagent.daemon import bundles as bundles_build  # noqa: PLC0415  (see the module docstring)

    return bundles_build.build_importer(
        config, cri, reloader, on_report=on_report, is_present=is_present
    )


@dataclass
class MediaImports:
    """Imports media as udev reports them: one at a time; a removal cancels its import."""

    config: Config
    make_importer: Callable[[], Importer]
    """Builds the importer when the first medium arrives (``build_importer``)."""
    on_imported: Callable[[], None]
    present: set[str] = field(default_factory=set)
    roots: dict[Path, str] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _importer: Importer | None = None

    @property
    def importer(self) -> Importer:
        if self._importer is None:
            self._importer = self.make_importer()
            self._importer.ports.is_present_on_media = self.is_present
        return self._importer

    def is_present(self, root: Path) -> bool:
        return self.roots.get(root) in self.present

    def on_event(self, event: MediaEvent) -> None:
        if event.kind is MediaKind.ARRIVED:
            self.present.add(event.devnode)
            if event.devnode not in self.tasks:
                task = asyncio.create_task(self._import(event), name=f"import {event.devnode}")
                self.tasks[event.devnode] = task
                task.add_done_callback(lambda _t: self.tasks.pop(event.devnode, None))
            return
        self.present.discard(event.devnode)
        log.info("bundle_media_removed", device=event.devnode, label=event.label)
        running = self.tasks.get(event.devnode)
        if running is not None:
            running.cancel()

    async def _import(self, event: MediaEvent) -> None:
        async with self.lock:
            target = self.config.bundles.media_dir / mount_dir_name(event)
            log.info(
                "bundle_media_detected", device=event.devnode, label=event.label, fs=event.fs_type
            )
            from nodeagent.adapters.bundles.mount import mount_readonly  # noqa: PLC0415

            mount: Mount = await asyncio.to_thread(
                mount_readonly, event.devnode, event.fs_type, target
            )
            self.roots[mount.target] = event.devnode
            try:
                report = await self.importer.import_bundle(mount.target, source=event.devnode)
            except asyncio.CancelledError:
                self._interrupted(event)
                raise
            finally:
                self.roots.pop(mount.target, None)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(mount.unmount, lazy=True)
            if report.state == "imported":
                self.on_imported()

    def _interrupted(self, event: MediaEvent) -> None:
        from nodeagent.bundles.importer import BundleMediaRemoved, BundleReport  # noqa: PLC0415

        gone = BundleMediaRemoved(
            f"{event.devnode} ({event.label}) was removed during the import; the images already "
            "in the runtime stay; plug it in again to finish"
        )
        report = BundleReport(
            event.devnode, "interrupted", reason=gone.reason, message=gone.message
        )
        log.warning(
            "bundle_interrupted", device=event.devnode, reason=gone.reason, error=gone.message
        )
        self.importer.ports.on_report(report)


async def media_loop(imports: MediaImports) -> None:
    """Watch udev for bundle media (also those present at start) and import them."""
    from nodeagent.adapters.bundles.udev import MediaWatcher  # noqa: PLC0415  (pyudev: only when watching)

    async with MediaWatcher(imports.config.bundles.label_pattern) as watcher:
        for event in watcher.existing():
            imports.on_event(event)
        async for event in watcher:
            imports.on_event(event)
