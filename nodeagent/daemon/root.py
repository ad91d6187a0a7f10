"""The composition root: builds adapters, wires services, runs them, stops in stages.

``nodeagent run`` lands here. Start-up order matters for a node that just
rebooted: the pins remembered from before are rendered first (so CRI-O,
which may be starting right now, finds them), then the watches are set up,
then READY=1 is sent and the first sync runs. SIGTERM cancels everything;
a pull in flight is cancelled in CRI-O too, and the next start resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.crio_config import CrioDropins
from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.host import (
    AuthFile,
    InsecureRegistries,
    StatvfsSpace,
    UsedBytesProbe,
    read_boot_id,
)
from nodeagent.adapters.inotify import DirectoryWatcher
from nodeagent.adapters.registry.client import ManifestCache, RegistryClient
from nodeagent.adapters.systemd import Notifier, RuntimeReloader
from nodeagent.bundles.imports import BundleBoard, MediaImports, build_importer, media_loop
from nodeagent.cluster.objects import PullProgress
from nodeagent.config import Config
from nodeagent.errors import NodeAgentError, TransientError
from nodeagent.pins import PinService
from nodeagent.prepull import PrePuller, PullPolicy
from nodeagent.specs import load_spec_dirs
from nodeagent.status import NodeStatus, conditions_for, progress_line, status_line
from nodeagent.sync import DiskPolicy, Reconciler

if TYPE_CHECKING:
    from nodeagent.cluster.tasks import StatusReporter

log = structlog.get_logger(__name__)

RESYNC_INTERVAL_S = 600.0
"""Full re-check even without changes: CRI-O may have wiped its store after a crash."""
RETRY_MAX_S = 60.0
BOOT_GRACE_S = 60.0
"""At boot CRI-O starts after nodeagent (``Before=crio.service``): until the runtime first
answered, an unreachable runtime in this window is expected and logged at info, not as the
catalog's "runtime does not answer" warning a technician would chase."""


@dataclass
class Progress:
    """Live pull progress for STATUS=, ``nodeagent status`` and the cluster status object."""

    pulling: set[str] = field(default_factory=set)
    pulled: set[str] = field(default_factory=set)
    failed: int = 0
    is_syncing: bool = False
    last: NodeStatus | None = None
    on_change: Callable[[], None] = lambda: None

    def start_sync(self) -> None:
        self.pulling.clear()
        self.pulled.clear()
        self.failed = 0
        self.is_syncing = True

    def end_sync(self) -> None:
        self.is_syncing = False
        self.pulling.clear()

    def snapshot(self) -> PullProgress:
        return PullProgress(
            tuple(sorted(self.pulling)), frozenset(self.pulled), self.failed, self.is_syncing
        )

    def line(self) -> str | None:
        """'pinned 0/190 images, pulling 4, 1 failed' while pulls run (None before any status)."""
        if self.last is None:
            return None
        totals = self.last.image_totals()
        failed = totals["failed"] + self.failed
        return progress_line(totals["pinned"], totals["total"], len(self.pulling), failed)

    def on_event(self, event: str, ref: str, fields: dict[str, object]) -> None:
        if event == "pull_started":
            self.pulling.add(ref)
        elif event in ("image_pulled", "pull_failed", "pull_retrying"):
            self.pulling.discard(ref)
            if event == "image_pulled":
                self.pulled.add(ref)
            self.failed += event == "pull_failed"
        level = "info" if event in ("image_pulled", "pull_retrying") else "debug"
        if event == "pull_failed":
            level = "error"
        getattr(log, level)(event, image=ref, **fields)
        self.on_change()


@dataclass
class Wiring:
    config: Config
    cri: CriClient
    reconciler: Reconciler
    dropins: CrioDropins
    state: JsonStateStore
    notifier: Notifier
    progress: Progress
    kick: asyncio.Event = field(default_factory=asyncio.Event)
    board: BundleBoard = field(default_factory=BundleBoard)
    media: MediaImports | None = None
    reporter: StatusReporter | None = None


def build(config: Config, *, notifier: Notifier | None = None) -> Wiring:
    """Every adapter and service, wired once."""
    rt = config.runtime
    cri = CriClient(rt.endpoint, timeout_s=rt.call_timeout_s)
    dropins = CrioDropins(rt.config_file, rt.config_dir, rt.transient_dropin_dir, rt.dropin_name)
    reloader = RuntimeReloader(rt.unit, pid_file=rt.pid_file, timeout_s=rt.reload_timeout_s)
    pins = PinService(dropins, reloader, cri, verify_timeout_s=rt.reload_timeout_s)
    state = JsonStateStore(config.state.dir)
    auth = AuthFile(config.pull.auth_file)
    progress = Progress()
    image_dirs: list[Path] = [Path("/var/tmp")]  # noqa: S108  containers/image's temp dir for blobs
    pull = config.pull
    policy = PullPolicy(
        concurrency=pull.concurrency,
        attempts=pull.attempts,
        backoff_initial_s=pull.backoff_initial_s,
        backoff_max_s=pull.backoff_max_s,
        stall_timeout_s=pull.stall_timeout_s,
        shared_layer_min_bytes=pull.shared_layer_min_bytes,
    )
    puller = PrePuller(
        cri,
        auth.credentials_for,
        policy,
        UsedBytesProbe(lambda: image_dirs),
        on_event=progress.on_event,
    )
    registry = RegistryClient(
        insecure=InsecureRegistries(rt.registries_conf, rt.registries_dir),
        timeout_s=rt.call_timeout_s,
        cache=ManifestCache(config.state.dir / "manifests"),
    )
    disk = DiskPolicy(
        config.disk.expansion_factor, config.disk.reserve_bytes, config.disk.reserve_percent
    )
    reconciler = Reconciler(
        load_specs=lambda: load_spec_dirs(config.spec_dirs()),
        runtime=cri,
        pins=pins,
        puller=puller,
        manifests=registry,
        space=StatvfsSpace(),
        credentials_for=auth.credentials_for,
        store=state,
        boot_id=read_boot_id(),
        disk=disk,
        on_image_fs=lambda mountpoint: image_dirs.append(Path(mountpoint)),
    )
    wiring = Wiring(config, cri, reconciler, dropins, state, notifier or Notifier(), progress)
    reconciler.on_progress = lambda status: publish(wiring, status, is_final=False)
    progress.on_change = lambda: progress_changed(wiring)
    wiring.board.on_change = lambda: save_status(wiring)
    wiring.media = MediaImports(
        config,
        lambda: build_importer(config, cri, reloader, on_report=wiring.board.update),
        on_imported=wiring.kick.set,
    )
    return wiring


def save_status(wiring: Wiring) -> None:
    """Write the status file: the last sync's status plus the bundles seen."""
    last = wiring.progress.last
    doc = last.to_json() if last else {"conditions": [], "pinnedImageSets": []}
    if wiring.board.reports:
        doc["bundles"] = wiring.board.to_json()
    wiring.state.save("status", doc)


def publish(wiring: Wiring, status: NodeStatus, *, is_final: bool = True) -> None:
    """A sync's status (``is_final``) or the interim one while its pulls run."""
    wiring.progress.last = status
    if is_final:
        wiring.board.mark_pinned({s.name for s in status.sets if s.state == "Pinned"})
    save_status(wiring)
    wiring.notifier.status(status_line(status))
    if wiring.reporter is not None:
        wiring.reporter.update(status, is_final=is_final)


def progress_changed(wiring: Wiring) -> None:
    """A pull started or ended: STATUS= and the cluster status follow."""
    line = wiring.progress.line()
    if line is not None:
        wiring.notifier.status(line)
    if wiring.reporter is not None:
        wiring.reporter.poke()


def publish_unreachable(wiring: Wiring, error: NodeAgentError) -> None:
    last = wiring.progress.last
    sets = last.sets if last else ()
    status = NodeStatus(
        sets=sets,
        conditions=conditions_for(sets, 0, error.message),
        runtime=last.runtime if last else None,
        last_error=str(error),
    )
    publish(wiring, status)


def _log_postponed(exc: TransientError, delay_s: float, *, is_booting: bool) -> None:
    """A sync that must wait: a warning, except for the runtime not up yet at boot."""
    if is_booting and exc.reason == "RuntimeUnreachable":
        log.info("runtime_awaited", reason=exc.reason, retry_in_s=round(delay_s))
        return
    log.warning("sync_postponed", reason=exc.reason, error=exc.message, retry_in_s=round(delay_s))


async def sync_loop(wiring: Wiring) -> None:
    """Sync on every kick; after a failure retry with backoff; re-check periodically."""
    delay_s = 1.0
    booted_at = time.monotonic()
    while True:
        wiring.kick.clear()
        started = time.monotonic()
        wiring.progress.start_sync()
        try:
            status = await wiring.reconciler.sync()
        except TransientError as exc:
            is_booting = (
                started - booted_at < BOOT_GRACE_S and not wiring.reconciler.has_reached_runtime
            )
            wiring.progress.end_sync()
            _log_postponed(exc, delay_s, is_booting=is_booting)
            publish_unreachable(wiring, exc)
            await _wait_kick(wiring, delay_s)
            delay_s = min(delay_s * 2, RETRY_MAX_S)
            continue
        except NodeAgentError as exc:
            log.error("sync_failed", reason=exc.reason, error=exc.message)
            wiring.progress.end_sync()
            publish_unreachable(wiring, exc)
            await _wait_kick(wiring, RETRY_MAX_S)
            continue
        delay_s = 1.0
        wiring.progress.end_sync()
        publish(wiring, status)
        log.info(
            "sync_finished",
            seconds=round(time.monotonic() - started, 1),
            status=status_line(status),
        )
        await _wait_kick(wiring, RESYNC_INTERVAL_S)


async def _wait_kick(wiring: Wiring, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wiring.kick.wait(), timeout_s)


async def watch_loop(wiring: Wiring, watcher: DirectoryWatcher) -> None:
    async for changed in watcher:
        log.info("files_changed", dirs=sorted(str(d) for d in changed))
        wiring.kick.set()


async def watchdog_loop(notifier: Notifier) -> None:
    interval_s = notifier.watchdog_interval_s()
    if interval_s is None:
        return
    while True:
        notifier.watchdog()
        await asyncio.sleep(interval_s / 2)


async def guard(name: str, work: Callable[[], Awaitable[None]]) -> None:
    """Run a long-lived task; say how it ended (failure, cancellation, unexpected exit)."""
    try:
        await work()
    except asyncio.CancelledError:
        log.debug("task_cancelled", task=name)
        raise
    except Exception as exc:
        log.exception("task_failed", task=name, error=str(exc))
        raise
    else:
        log.debug("task_exited", task=name)


def watched_dirs(config: Config) -> list[Path]:
    rt = config.runtime
    specs = [path for path, _ in config.spec_dirs()]
    return [*specs, rt.config_dir, rt.config_file.parent]


async def run(config: Config) -> int:
    """Run until SIGTERM/SIGINT; return the process exit code."""
    wiring = build(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("daemon_started", config=str(config.source), endpoint=config.runtime.endpoint)
    try:
        await wiring.reconciler.boot()
    except NodeAgentError as exc:
        log.warning("pins_not_restored", reason=exc.reason, error=exc.message)
    try:
        async with DirectoryWatcher(watched_dirs(config), recursive=True) as watcher:
            wiring.notifier.ready("starting first sync")
            await _serve(wiring, watcher, stop)
    finally:
        wiring.notifier.stopping("stopping")
        await wiring.cri.close()
        log.info("daemon_stopped")
    return 0


async def _serve(wiring: Wiring, watcher: DirectoryWatcher, stop: asyncio.Event) -> None:
    tasks: dict[str, Callable[[], Awaitable[None]]] = {
        "sync": lambda: sync_loop(wiring),
        "watch": lambda: watch_loop(wiring, watcher),
        "watchdog": lambda: watchdog_loop(wiring.notifier),
    }
    if wiring.config.bundles.watch_media and wiring.media is not None:
        media = wiring.media
        tasks["media"] = lambda: media_loop(media)
    async with contextlib.AsyncExitStack() as stack:
        if wiring.config.cluster.enabled:
            tasks |= await _cluster_tasks(wiring, stack)
        await _run_tasks(tasks, stop)


async def _cluster_tasks(
    wiring: Wiring, stack: contextlib.AsyncExitStack
) -> dict[str, Callable[[], Awaitable[None]]]:
    """Cluster mode's tasks; imported here so a node without a cluster never loads the client."""
    from nodeagent.adapters.kube import KubeApi  # noqa: PLC0415
    from nodeagent.cluster.objects import FIELD_MANAGER  # noqa: PLC0415
    from nodeagent.cluster.tasks import ClusterSpecs, Connection, StatusReporter  # noqa: PLC0415

    config = wiring.config
    api = KubeApi(
        config.cluster.kubeconfig,
        timeout_s=config.cluster.request_timeout_s,
        field_manager=FIELD_MANAGER,
    )
    stack.push_async_callback(api.close)
    connection = Connection(api.server)
    reporter = StatusReporter(config, api, connection, progress=wiring.progress.snapshot)
    wiring.reporter = reporter
    if wiring.progress.last is not None:
        reporter.update(wiring.progress.last, is_final=True)
    specs = ClusterSpecs(
        config,
        api,
        connection,
        on_node=reporter.set_node,
        on_placement=reporter.set_placement,
    )
    log.info("cluster_mode", server=api.server, node=specs.node, selector=str(specs.selector))
    return {"cluster-specs": specs.run, "cluster-status": reporter.run}


async def _run_tasks(tasks: dict[str, Callable[[], Awaitable[None]]], stop: asyncio.Event) -> None:
    async with asyncio.TaskGroup() as group:
        running = [group.create_task(guard(name, work), name=name) for name, work in tasks.items()]
        await stop.wait()
        log.info("daemon_stopping")
        for task in running:
            task.cancel()
