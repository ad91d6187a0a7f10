"""``nodeagent run``: start in order, run every task guarded, stop in stages.

Start-up order matters for a node that just rebooted: the pins remembered from before
are rendered first (so CRI-O, which may be starting right now, finds them), then the
watches are set up, then READY=1 is sent and the first sync runs. SIGTERM cancels
everything; a pull in flight is cancelled in CRI-O too, and the next start resumes.

The exit code is 0 after SIGTERM, or the code of the critical task that ended the
daemon (``supervisor.exit_code_for``; docs/operations.md lists them).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from nodeagent.adapters.files import remove_file
from nodeagent.adapters.fips import read_posture
from nodeagent.adapters.inotify import DirectoryWatcher
from nodeagent.adapters.nodeos import NodeOsReader
from nodeagent.adapters.pins_lock import PINS_LOCK_NAME, PinsLock
from nodeagent.adapters.systemd import Notifier
from nodeagent.config import Config
from nodeagent.daemon.mirror_dropin import dropin_loop
from nodeagent.daemon.stopping import report_when_stopping
from nodeagent.daemon.supervisor import Task
from nodeagent.daemon.wiring import Wiring, build, has_bundles
from nodeagent.errors import NodeAgentError
from nodeagent.site.roles import is_following

if TYPE_CHECKING:
    from nodeagent.metrics.recorder import Recorder
    from nodeagent.mirror.board import MirrorState

log = structlog.get_logger(__name__)


PINS_LOCK_WAIT_S = 60.0
"""How long the daemon waits at start for a ``render-pins --write`` holding the pin lock."""


async def run(config: Config) -> int:
    """Run until SIGTERM/SIGINT; return the process exit code.

    The pin lock is held from before the first pin write to the exit: while the daemon runs
    it alone writes the pin file (``render-pins --write`` leaves it alone, decision 0044)."""
    lock = PinsLock(config.state.run_dir / PINS_LOCK_NAME)
    await lock.acquire(PINS_LOCK_WAIT_S)
    try:
        return await _run(config)
    finally:
        lock.release()


async def _run(config: Config) -> int:
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
    remove_stale_mirror(config)
    await asyncio.to_thread(keep_mirror_credential, config)
    exit_code = 0
    reporter = asyncio.create_task(report_when_stopping(stop), name="stop-reporter")
    try:
        async with DirectoryWatcher(watched_dirs(config), recursive=True) as watcher:
            wiring.notifier.ready("starting first sync")
            exit_code = await wiring.supervisor.run(tasks(wiring, watcher), stop)
    finally:
        stop.set()  # a critical task that ended stops the daemon too
        wiring.notifier.stopping("stopping")
        await wiring.close()
        # Worker threads finish their step here (asyncio.run would wait for them after
        # the last log line), while the reporter can still say which ones are late.
        await loop.shutdown_default_executor()
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)
        log.info("daemon_stopped", exit_code=exit_code)
    return exit_code


def tasks(wiring: Wiring, watcher: DirectoryWatcher) -> list[Task]:
    """Critical: the sync loop, the spec watch, the watchdog. Optional: the runtime socket's
    watch, the store's collection, media, the peer server's reports, the fetcher, the offline drill,
    cluster."""
    config = wiring.config
    found = [
        Task("sync", wiring.reconciler.run, is_critical=True),
        Task(
            "watch",
            lambda: watch_loop(watcher, wiring.reconciler.request_sync),
            is_critical=True,
        ),
    ]
    if wiring.notifier.watchdog_interval_s() is not None:
        found.append(Task("watchdog", lambda: watchdog_loop(wiring.notifier), is_critical=True))
    found.append(
        Task(
            "runtime-watch",
            lambda: runtime_socket_loop(runtime_socket(config), wiring.reconciler.request_sync),
            is_critical=False,
        )
    )
    found.append(Task("store-gc", lambda: store_gc_loop(wiring), is_critical=False))
    found.append(
        Task(
            "mirror-dropin",
            lambda: dropin_loop(config, wiring.reloader, wiring.reporter.dropin_checked),
            is_critical=False,
        )
    )
    if config.bundles.watch_media:
        found.append(Task("media", lambda: media_loop(wiring), is_critical=False))
    if config.site.serve or config.mirror.enabled:
        found.append(Task("peer-reports", lambda: peer_reports_loop(wiring), is_critical=False))
    if is_following(config):
        found.append(Task("site-fetcher", lambda: fetcher_loop(wiring), is_critical=False))
    if wiring.offline is not None:
        found.append(Task("offline-drill", wiring.offline.run, is_critical=False))
    if config.node_os.report:
        found.append(Task("node-os", lambda: node_os_loop(wiring), is_critical=False))
    if wiring.recorder is not None:
        found.append(Task("metrics", metrics_loop(wiring.recorder, config), is_critical=False))
    if wiring.cluster is not None:
        found.extend(wiring.cluster.tasks(wiring.reconciler.request_sync))
    return found


def metrics_loop(recorder: Recorder, config: Config) -> Callable[[], Awaitable[None]]:
    """The metrics endpoint's task (``[metrics] enabled``; prometheus_client loads here)."""
    from nodeagent.daemon.metrics import MetricsTask  # noqa: PLC0415  (metrics on)

    return MetricsTask(recorder, config.metrics.listen).run


async def node_os_loop(wiring: Wiring) -> None:
    """Read the node's FIPS posture at start (decision 0075), and its OS image at start and
    every ``[node_os] interval_s`` (docs/operations.md)."""
    switch = wiring.config.bundles.fips_switch
    posture = await asyncio.to_thread(read_posture, always_probe=False, path=switch)
    wiring.reporter.crypto_read(posture)
    settings = wiring.config.node_os
    reader = NodeOsReader(
        os_release=settings.os_release,
        bootc=settings.bootc,
        rpm_ostree=settings.rpm_ostree,
        timeout_s=settings.timeout_s,
    )
    while True:
        wiring.reporter.os_image_read(await reader.read())
        await asyncio.sleep(settings.interval_s)


async def watch_loop(watcher: DirectoryWatcher, request_sync: Callable[[], None]) -> None:
    async for changed in watcher:
        log.info("files_changed", dirs=sorted(str(d) for d in changed))
        request_sync()


async def runtime_socket_loop(socket: Path, request_sync: Callable[[], None]) -> None:
    """Sync as soon as the runtime's socket appears (CRI-O started or restarted).

    After a power cut CRI-O may have removed pinned images (a wiped or repaired store);
    nodeagent finds them missing at the sync that follows the runtime's start, within
    seconds, instead of at the end of its retry backoff or the periodic re-check. Only the
    socket's own directory is watched, not its subdirectories (container exit files).
    """
    async with DirectoryWatcher([socket.parent], debounce_s=0.1) as watcher:
        async for _changed in watcher:
            if await asyncio.to_thread(socket.exists):
                log.info("runtime_socket_appeared", socket=str(socket))
                request_sync()


def remove_stale_mirror(config: Config) -> None:
    """A loopback mirror drop-in left by a session that never ended (the daemon was killed
    mid-import or mid-restore) points CRI-O at a port nothing serves: remove it. The first
    sync reloads CRI-O (``Reconciler.boot`` owes it a reload)."""
    path = config.runtime.registries_dir / config.bundles.mirror_dropin_name
    try:
        if remove_file(path):
            log.warning(
                "stale_mirror_removed",
                file=str(path),
                error="a loopback mirror left by an import or restore that was cut off "
                "(the daemon stopped without removing it); removed, CRI-O reloads at the "
                "first sync",
            )
    except NodeAgentError as exc:
        log.warning("stale_mirror_not_removed", reason=exc.reason, error=exc.message)


def keep_mirror_credential(config: Config) -> None:
    """The node mirror's credential and its verifiers for the peer process (decision 0057);
    a failure is said and leaves registry sets unserved, never stops the daemon."""
    from nodeagent.adapters.crio_config import CrioDropins  # noqa: PLC0415
    from nodeagent.adapters.mirror_credential import (  # noqa: PLC0415
        publish_mirror_credential,
        withdraw_mirror_credential,
    )
    from nodeagent.daemon.peer_reports import report_socket_path  # noqa: PLC0415

    directory = report_socket_path(config).parent
    runtime = config.runtime
    try:
        if not config.mirror.enabled:
            withdraw_mirror_credential(directory)
            return
        dropins = CrioDropins(
            runtime.config_file,
            runtime.config_dir,
            runtime.transient_dropin_dir,
            runtime.dropin_name,
        )
        found: list[Path | None] = [dropins.global_auth_file(), config.pull.auth_file]
        read_only = [p for p in found if p is not None and p != config.mirror.auth_file]
        publish_mirror_credential(
            config.mirror.listen, directory, read_only, root_auth_file=config.mirror.auth_file
        )
    except NodeAgentError as exc:
        log.warning("mirror_credential_not_published", reason=exc.reason, error=exc.message)


def runtime_socket(config: Config) -> Path:
    return Path(config.runtime.endpoint.removeprefix("unix://"))


async def watchdog_loop(notifier: Notifier) -> None:
    interval_s = notifier.watchdog_interval_s()
    if interval_s is None:
        return
    while True:
        notifier.watchdog()
        await asyncio.sleep(interval_s / 2)


def store_gc_interval_s(gc_grace_s: float) -> float:
    """How often the store is collected: half the grace period, from 10 s to 10 minutes."""
    return min(max(gc_grace_s / 2, 10.0), 600.0)


async def store_gc_loop(wiring: Wiring) -> None:
    """Remove store blobs nothing kept refers to, once unreferenced for the grace period
    (docs/store.md). Only a store holding a bundle loads the store's code."""
    store = wiring.config.store
    interval_s = store_gc_interval_s(store.gc_grace_s)
    while True:
        await asyncio.sleep(interval_s)
        if not await asyncio.to_thread(has_bundles, wiring.config.store_dir):
            continue
        from nodeagent.adapters.bundles.agent_image import self_digests  # noqa: PLC0415
        from nodeagent.adapters.store import keeper  # noqa: PLC0415  (a stored bundle)
        from nodeagent.store.keeping import KeepRules  # noqa: PLC0415

        rules = KeepRules(store.gc_grace_s, store.keep_newest_per_channel)
        pinned = wiring.reconciler.pinned_sets()
        collected = await asyncio.to_thread(
            keeper.collect,
            wiring.config.store_dir,
            pinned,
            rules,
            self_digests=self_digests(os.environ),
        )
        wiring.metrics.store_measured(collected.view.stored_bytes)


async def media_loop(wiring: Wiring) -> None:
    """Watch udev for bundle media (also those present at start) and import them."""
    from nodeagent.adapters.bundles.udev import MediaWatcher  # noqa: PLC0415  (pyudev: media on)

    bundles = wiring.config.bundles
    watcher = MediaWatcher(
        bundles.label_pattern, fs_types=bundles.media_fs_types, buses=bundles.media_buses
    )
    async with watcher:
        await wiring.media.follow(watcher)


def set_aside_reported(store_root: Path, digest: str) -> bool:
    """``keeper.set_aside_corrupt``, loaded with the first blob reported damaged (1.6 MiB
    the idle daemon does not hold while the node mirror only reports its state)."""
    from nodeagent.adapters.store.keeper import set_aside_corrupt  # noqa: PLC0415

    return set_aside_corrupt(store_root, digest)


async def peer_reports_loop(wiring: Wiring) -> None:
    """Check what the peer server's process reports (``[site] serve``: the peer server runs
    in its own process, nodeagent-peer.service; decision 0056)."""
    from nodeagent.adapters.peer_reports import ReportSocket  # noqa: PLC0415  (serving on)
    from nodeagent.adapters.store.blobs import BlobStore  # noqa: PLC0415
    from nodeagent.daemon.peer_reports import PeerReports, report_socket_path  # noqa: PLC0415

    config = wiring.config
    await asyncio.to_thread(BlobStore(config.store_dir).ensure)  # the peer process reads it
    socket = ReportSocket(report_socket_path(config))
    reports = PeerReports(
        socket,
        config.store_dir,
        set_aside_reported,
        wiring.metrics,
        mirror_listen=config.mirror.listen,
        on_mirror=wiring.reporter.mirror_reported,
        on_missing=lambda _digest: wiring.fetch_wanted.set(),
        socket_state=mirror_socket_state if _is_under_systemd(config) else None,
    )
    await reports.run()


MIRROR_SOCKET_UNIT = "nodeagent-mirror.socket"
"""The node mirror's socket unit (systemd/nodeagent-mirror.socket, decision 0063)."""


def _is_under_systemd(config: Config) -> bool:
    """The daemon runs as a systemd service (``INVOCATION_ID``) with the node mirror on:
    only then is there a socket unit to ask about."""
    return config.mirror.enabled and bool(os.environ.get("INVOCATION_ID"))


async def mirror_socket_state() -> MirrorState:
    """The node mirror's state from its socket unit, asked of systemd in a child."""
    from nodeagent.adapters.systemd import socket_unit_state  # noqa: PLC0415
    from nodeagent.mirror.board import socket_state  # noqa: PLC0415

    found = await socket_unit_state(MIRROR_SOCKET_UNIT, None)
    return "unknown" if found is None else socket_state(*found)


async def fetcher_loop(wiring: Wiring) -> None:
    """Fetch the bundles this node follows from its peers (``[site] follow``; docs/site.md).
    The fetch code loads once a peer may have something to give (``_until_offered``)."""
    await _until_offered(wiring)
    from nodeagent.daemon.fetching import follow_peers  # noqa: PLC0415  (decision 0069)

    await follow_peers(wiring)


async def _until_offered(wiring: Wiring) -> None:
    """Return at once with static peers (asked over HTTPS) or a store that holds something
    (a fetch or an import to resume); in cluster mode otherwise, once a discovered peer
    publishes a bundle: until then a look could fetch nothing, and the fetch code (1.4 MiB
    resident) stays unloaded on an idle node (decision 0069)."""
    cluster = wiring.cluster
    directory = cluster.peers if cluster is not None else None
    if directory is None or wiring.config.site.peers:
        return
    bundles = wiring.config.store_dir / "bundles"
    try:
        if await asyncio.to_thread(lambda: next(bundles.iterdir(), None) is not None):
            return
    except FileNotFoundError:
        pass
    except OSError:
        return  # the fetch code reads it and says why
    while not any(p.bundles is None or p.bundles for p in directory.peers()):
        await directory.changed(directory.version)


def watched_dirs(config: Config) -> list[Path]:
    rt = config.runtime
    specs = [path for path, _ in config.spec_dirs()]
    return [*specs, rt.config_dir, rt.config_file.parent]
