"""Every adapter and service of the daemon, built once and handed to each other.

Nothing here decides anything: policies come from the configuration
(``policies``), the sync loop's timing and retries live with the Reconciler, the
status is published by ``reporting.Reporter``. Each service receives its collaborators
in its constructor. Cluster mode and the bundle importer are built from modules loaded
only when they are on (``daemon.cluster``, ``daemon.bundles``), so a standalone node
without media never imports lightkube, pyudev or the importer; the store's code loads only
once the store holds something or ``[store] registry_sets`` has images to fetch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.crio_config import CrioDropins
from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.host import (
    AuthFile,
    StagingProbe,
    StatvfsSpace,
    read_boot_id,
)
from nodeagent.adapters.offline import HostFacts, KubePodWarnings, api_pods
from nodeagent.adapters.registry.access import RegistryAccess, registry_access
from nodeagent.adapters.registry.cache import ManifestCache
from nodeagent.adapters.systemd import Notifier, RuntimeReloader
from nodeagent.bundles.imports import MediaImports
from nodeagent.config import Config
from nodeagent.daemon.policies import Policies, policies_from
from nodeagent.daemon.releases import LazyReleases
from nodeagent.daemon.supervisor import Supervisor
from nodeagent.disk import DiskAdmission
from nodeagent.metrics import NO_METRICS, Metrics
from nodeagent.offline.drill import OfflineDrill
from nodeagent.pins import PinService
from nodeagent.prepull import PrePuller, PullResult
from nodeagent.releases import SiteReadiness, release_reports
from nodeagent.reporting import BundleBoard, PullTally, Reporter
from nodeagent.specs import load_spec_dirs
from nodeagent.status import DiskStatus, ReleaseReport
from nodeagent.sync import Reconciler
from nodeagent.sync.copies import RegistryStore, SetImages, StoredFromRegistry

if TYPE_CHECKING:
    from nodeagent.bundles.importer import Importer
    from nodeagent.bundles.imports import MountedMedium
    from nodeagent.bundles.restore import StoreRestorer
    from nodeagent.daemon.cluster import ClusterMode
    from nodeagent.metrics.recorder import Recorder


@dataclass
class Wiring:
    config: Config
    policies: Policies
    cri: CriClient
    reloader: RuntimeReloader
    state: JsonStateStore
    notifier: Notifier
    reporter: Reporter
    reconciler: Reconciler
    supervisor: Supervisor
    media: MediaImports
    cluster: ClusterMode | None = None
    offline: OfflineDrill | None = None
    recorder: Recorder | None = None
    """``[metrics] enabled``: what the endpoint exports (else reports go to ``NO_METRICS``)."""
    fetch_wanted: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the node mirror was asked for a digest the store lacks: the fetcher looks
    at its peers at once instead of at its next poll (decision 0061)."""

    @property
    def metrics(self) -> Metrics:
        return self.recorder or NO_METRICS

    async def close(self) -> None:
        if self.cluster is not None:
            await self.cluster.close()
        await self.cri.close()


def _site_readiness(cluster: ClusterMode | None) -> Callable[[str], SiteReadiness | None]:
    """Where this node can know how many nodes pinned a release: the one-touch starter's
    Nodes and NodeImageStatuses (their RBAC is its opt-in); else it cannot (decision 0073)."""
    if cluster is not None and cluster.starter is not None:
        return cluster.starter.readiness
    return lambda _digest: None


def build(
    config: Config, *, notifier: Notifier | None = None, keeps_last_status: bool = False
) -> Wiring:
    """Every adapter and service, wired once. ``keeps_last_status``: a command that may end
    before its first sync (``bundle import`` by hand) keeps the sets of this boot's status
    file in what it writes; the daemon does not (after a crash in the same boot the runtime
    may have lost what that file says is pinned: until its first sync it claims nothing)."""
    if config.cluster.enabled:
        from nodeagent.adapters.kubelet_identity import with_node_name  # noqa: PLC0415

        config = with_node_name(config)  # the kubelet's name for this node, logged once
    rt = config.runtime
    policies = policies_from(config)
    notifier = notifier or Notifier()
    cri = CriClient(rt.endpoint, timeout_s=rt.call_timeout_s)
    dropins = CrioDropins(rt.config_file, rt.config_dir, rt.transient_dropin_dir, rt.dropin_name)
    reloader = RuntimeReloader(rt.unit, pid_file=rt.pid_file, timeout_s=rt.reload_timeout_s)
    state = JsonStateStore(config.state.dir)
    auth = AuthFile(config.pull.auth_file)
    tally = PullTally()
    recorder = _recorder() if config.metrics.enabled else None
    metrics: Metrics = recorder or NO_METRICS
    releases = LazyReleases(config.store_dir, tuple(d for d, _ in config.spec_dirs()))
    cluster = _cluster(config, tally, releases) if config.cluster.enabled else None
    if cluster is not None and cluster.version_watch is not None:
        watch = cluster.version_watch
        watch.listeners.append(lambda _obj: metrics.release_targets(watch.target_versions()))
    offline_changed = asyncio.Event()
    boot_id = read_boot_id()
    reporter = Reporter(
        line=notifier,
        store=state,
        cluster=cluster.sink if cluster else None,
        tally=tally,
        on_synced=_after_sync(offline_changed, cluster),
        metrics=metrics,
        releases_source=_release_reports(releases, _cluster_version(cluster)),
        boot_id=boot_id if keeps_last_status else "",
        board=BundleBoard(site_readiness=_site_readiness(cluster)),
    )
    if cluster is not None and cluster.version_watch is not None:
        cluster.version_watch.listeners.append(lambda _obj: reporter.releases_changed())
    if cluster is not None and cluster.starter is not None:
        cluster.starter.on_said = reporter.upgrade_start_said
    puller = PrePuller(
        cri,
        auth.credentials_for,
        policies.pull,
        StagingProbe(dropins.staging_dirs),
        on_event=reporter.pull_event,
    )
    # Look-ups, registry sets and bundle create: one construction (adapters.registry.access).
    access = registry_access(
        rt, auth.credentials_for, cache=ManifestCache(config.state.dir / "manifests")
    )
    registry = access.client
    admission = DiskAdmission(
        runtime=cri,
        manifests=registry,
        space=StatvfsSpace(),
        credentials_for=access.credentials_for,
        policy=policies.disk,
        on_sync=access.on_sync,
        metrics=metrics,
        on_sized=reporter.pulls_sized,
    )
    reconciler = Reconciler(
        load_specs=lambda: load_spec_dirs(config.spec_dirs()),
        runtime=cri,
        pins=PinService(dropins, reloader, cri, verify_timeout_s=rt.reload_timeout_s),
        puller=puller,
        admission=admission,
        store=state,
        boot_id=boot_id,
        report=reporter,
        schedule=policies.schedule,
        restorer=LazyRestorer(
            config.store_dir, lambda: _restorer(config, policies, cri, reloader, metrics), metrics
        ),
        registry_store=(
            LazyRegistryStore(config.store_dir, lambda: _registry_store(config, access), metrics)
            if config.store.registry_sets
            else None
        ),
        pull_terms=cluster.gate.current if cluster else None,
    )
    supervisor = Supervisor()

    def make_importer(
        is_present: Callable[[Path], bool], release: Callable[[Path], None]
    ) -> Importer:
        from nodeagent.daemon.bundles import (  # noqa: PLC0415
            build_importer,
            with_release_signatures,
            with_self_update,
        )

        return build_importer(
            config,
            policies,
            cri,
            reloader,
            report=with_self_update(
                config,
                with_release_signatures(
                    config,
                    reporter.bundle_report,
                    cluster.api if cluster else None,
                    supervisor.spawn,
                ),
                supervisor.spawn,
            ),
            is_present=is_present,
            release=release,
            node_labels=cluster.specs.node_labels if cluster else lambda: None,
            wait_node_labels=cluster.specs.wait_node_labels if cluster else None,
            cluster_version=_cluster_version(cluster),
            space_note=cluster.retirer.space_note if cluster and cluster.retirer else lambda: "",
        )

    media = MediaImports(
        media_dir=config.bundles.media_dir,
        make_importer=make_importer,
        mount=_mount,
        spawn=supervisor.spawn,
        report=reporter.bundle_report,
        on_imported=reconciler.request_sync,
    )
    offline = _offline(config, cri, reporter, cluster, offline_changed)
    return Wiring(
        config,
        policies,
        cri,
        reloader,
        state,
        notifier,
        reporter,
        reconciler,
        supervisor,
        media,
        cluster,
        offline,
        recorder,
    )


def _offline(
    config: Config,
    cri: CriClient,
    reporter: Reporter,
    cluster: ClusterMode | None,
    changed: asyncio.Event,
) -> OfflineDrill | None:
    """The offline drill (docs/offline.md): pods from the API in cluster mode, else static."""
    if not config.offline.drill:
        return None
    pods = warnings = None
    if cluster is not None:
        node = cluster.specs.node
        pods = api_pods(cluster.api, node)
        warnings = KubePodWarnings(cluster.api, node) if config.offline.pod_events else None
    return OfflineDrill(
        HostFacts(config, cri, pods=pods),
        reporter,
        interval_s=config.offline.interval_s,
        warnings=warnings,
        changed=changed,
    )


class LazyRestorer:
    """``sync.losses.ImageRestorer`` that loads the store's restorer (the loopback
    server, the mirror) only once the store holds a bundle: idle nodes without one never
    import it."""

    def __init__(
        self, store_dir: Path, build: Callable[[], StoreRestorer], metrics: Metrics = NO_METRICS
    ) -> None:
        self.store_dir = store_dir
        self._build = build
        self._built: StoreRestorer | None = None
        self.metrics = metrics

    def _restorer(self) -> StoreRestorer:
        if self._built is None:
            self._built = self._build()
        return self._built

    async def holds(self, refs: Sequence[str]) -> list[str]:
        if not await asyncio.to_thread(has_bundles, self.store_dir):
            return []
        return await self._restorer().holds(refs)

    async def restore(self, refs: Sequence[str]) -> Mapping[str, PullResult]:
        started_s = time.monotonic()
        results = await self._restorer().restore(refs)
        if results:
            self.metrics.restore_ended(seconds=time.monotonic() - started_s)
        return results


class LazyRegistryStore:
    """``sync.copies.RegistryStore`` (``[store] registry_sets``) that loads the store's code
    only once a sync has images to fetch, or the store holds something to prune."""

    def __init__(
        self, store_dir: Path, build: Callable[[], RegistryStore], metrics: Metrics = NO_METRICS
    ) -> None:
        self.store_dir = store_dir
        self._build = build
        self._built: RegistryStore | None = None
        self.metrics = metrics

    async def store(
        self, sets: Sequence[SetImages], images_need: DiskStatus | None
    ) -> StoredFromRegistry:
        if self._built is None:
            if not any(s.missing for s in sets) and not await asyncio.to_thread(
                has_registry_sets, self.store_dir
            ):
                return StoredFromRegistry()
            self._built = self._build()
        stored = await self._built.store(sets, images_need)
        if stored.fetched_bytes:  # bytes from a registry, as CRI-O's pulls count
            from nodeagent.metrics.series import Transfer  # noqa: PLC0415  (registry_sets)

            self.metrics.transferred(Transfer.PULLED, stored.fetched_bytes)
        return stored


def has_bundles(store_dir: Path) -> bool:
    """Whether the node's image store holds an accepted bundle or a registry set's record
    (a directory look): only then is the store's code loaded."""
    return _has_entries(store_dir / "bundles") or has_registry_sets(store_dir)


def has_registry_sets(store_dir: Path) -> bool:
    return _has_entries(store_dir / "sets")


def _has_entries(directory: Path) -> bool:
    try:
        return any(directory.iterdir())
    except OSError:
        return False


def _restorer(
    config: Config, policies: Policies, cri: CriClient, reloader: RuntimeReloader, metrics: Metrics
) -> StoreRestorer:
    from nodeagent.daemon.bundles import build_restorer  # noqa: PLC0415  (a stored bundle)

    return build_restorer(config, policies, cri, reloader, metrics)


def _registry_store(config: Config, access: RegistryAccess) -> RegistryStore:
    from nodeagent.daemon.bundles import build_registry_store  # noqa: PLC0415  (registry_sets)

    return build_registry_store(config, access.client, access.credentials_for)


def _mount(devnode: str, fs_type: str, target_dir: Path) -> MountedMedium:
    from nodeagent.adapters.bundles.mount import mount_readonly  # noqa: PLC0415  (first medium)

    return mount_readonly(devnode, fs_type, target_dir)


def _recorder() -> Recorder:
    from nodeagent.metrics.recorder import Recorder  # noqa: PLC0415  ([metrics] enabled)

    return Recorder()


def _cluster(config: Config, tally: PullTally, releases: LazyReleases) -> ClusterMode:
    from nodeagent.daemon.cluster import ClusterMode  # noqa: PLC0415  (lightkube: cluster only)

    return ClusterMode.build(config, progress=tally.snapshot, releases=releases)


def _release_reports(
    releases: LazyReleases, version: Callable[[], str | None]
) -> Callable[[], tuple[ReleaseReport, ...]]:
    """``status.releases``: the store's releases judged against the cluster's version of now."""
    return lambda: release_reports(releases.held(), version())


def _cluster_version(cluster: ClusterMode | None) -> Callable[[], str | None]:
    """The cluster's version for the importer's upgrade-path check (None: not known)."""
    watch = cluster.version_watch if cluster is not None else None
    return watch.current_version if watch is not None else lambda: None


def _after_sync(offline_changed: asyncio.Event, cluster: ClusterMode | None) -> Callable[[], None]:
    """After each sync: the offline drill may run again; the cluster's upgrade target is
    checked against what the node now pins (said once when that changes)."""
    watch = cluster.version_watch if cluster is not None else None

    def after() -> None:
        offline_changed.set()
        if watch is not None:
            watch.check_target()

    return after
