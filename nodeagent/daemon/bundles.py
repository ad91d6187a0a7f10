"""The bundle importer with its adapters, built when the first medium arrives.

A module of its own so that a daemon that never sees a bundle never loads the importer,
the loopback server's launcher, the mirror drop-in and their dependencies; ``wiring`` imports it
lazily. The CLI's ``bundle import`` builds the same importer. The store's restorer and
the registry sets' fetcher (``[store] registry_sets``) are built here too, when needed.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from nodeagent.adapters.bundles.agent_image import AgentImageStager, running_digest
from nodeagent.adapters.bundles.intake import SpecDirs, check_for_import
from nodeagent.adapters.bundles.mirror import MirrorDropin
from nodeagent.adapters.bundles.registries_d import RegistriesD
from nodeagent.adapters.bundles.release import ConfigMaps, StoredSignatures
from nodeagent.adapters.bundles.session_server import (
    ChildLauncher,
    Launcher,
    SessionServer,
    SocketLauncher,
)
from nodeagent.adapters.cri.client import CriClient
from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.host import StatvfsSpace
from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.adapters.store.accepted import accepted_stamps
from nodeagent.adapters.store.copier import StoreLimits
from nodeagent.adapters.store.node_store import NodeImageStore
from nodeagent.adapters.store.registry_sets import RegistrySets
from nodeagent.bundles.import_ports import ImporterPorts
from nodeagent.bundles.importer import Importer
from nodeagent.bundles.manifest import ExpectedFile
from nodeagent.bundles.mirror_import import ARRIVAL_WAIT_S
from nodeagent.bundles.release_signatures import SignaturePublisher, is_due
from nodeagent.bundles.restore import StoreRestorer
from nodeagent.bundles.serving import MirrorPullPorts
from nodeagent.config import Config
from nodeagent.daemon.policies import Policies
from nodeagent.errors import (
    BundleServerFailed,
    HostFileError,
    ImageStageFailed,
    NodeAgentError,
    StoreError,
)
from nodeagent.metrics import NO_METRICS, Metrics
from nodeagent.metrics.series import Transfer
from nodeagent.ports import PullEvent, RegistryCredentials, Reloader
from nodeagent.prepull import PrePuller
from nodeagent.registries import node_platform
from nodeagent.reporting import log_pull
from nodeagent.status import BundleReport

log = structlog.get_logger("nodeagent.bundles.imports")


def session_launcher(config: Config) -> Launcher:
    """Where a mirror session's server process comes from (decision 0064): systemd's
    ``nodeagent-session.socket`` (unprivileged), or with ``[bundles] session_socket = ""``
    the daemon's own child (its own user: development and the test harness)."""
    path = config.bundles.session_socket
    if path is not None:
        return SocketLauncher(path)
    return ChildLauncher(session_command(config.source))


def session_command(config_file: Path) -> list[str]:
    """``nodeagent serve-session`` run by this interpreter (its ``[log]`` from ``config_file``)."""
    return [sys.executable, "-m", "nodeagent", "--config", str(config_file), "serve-session"]


def served_bundle(config: Config, *, arrival_wait_s: int = 0) -> Callable[..., SessionServer]:
    """``importer.BundleServerPort`` factory: ``(root, blobs, tags=None)`` served by a
    session process; ``arrival_wait_s``: how long it awaits a listed file not there yet."""
    return functools.partial(SessionServer, session_launcher(config), arrival_wait_s=arrival_wait_s)


def _restored(metrics: Metrics, served: SessionServer) -> None:
    """A restore's server closed: the bytes it served, and each stored blob it refused to
    serve because it no longer matched its digest (the store's damage, for the metrics;
    not the server process's own failure)."""
    metrics.transferred(Transfer.RESTORED, served.bytes_served())
    for refused in served.rejections:
        if not isinstance(refused, BundleServerFailed):
            metrics.store_damaged(refused.reason)


def node_store(config: Config) -> NodeImageStore:
    """The node's image store, with the ``[store]`` caps and the ``[disk]`` reserve."""
    store, disk = config.store, config.disk
    limits = StoreLimits(store.max_bytes, store.max_percent, disk.reserve_bytes)
    bundles = config.bundles
    return NodeImageStore(
        config.store_dir, bundles.trusted_keys_dir, limits, fips_switch=bundles.fips_switch
    )


def _local_puller(cri: CriClient, policies: Policies) -> PrePuller:
    """Pulls from nodeagent's own loopback server: anonymous (no registry credentials go
    to it), with the bundle pull policy."""
    return PrePuller(cri, lambda _ref: None, policies.bundle_pull, on_event=_log_pull)


def _log_pull(event: PullEvent) -> None:
    """Each image's steps in the journal, marked as coming from the bundle."""
    log_pull(event, source="bundle")


def _log_restore_pull(event: PullEvent) -> None:
    """Each restored image's steps in the journal, marked as coming from the node's store."""
    log_pull(event, source="store")


def build_importer(
    config: Config,
    policies: Policies,
    cri: CriClient,
    reloader: Reloader,
    *,
    report: Callable[[BundleReport], None],
    is_present: Callable[[Path], bool] = lambda root: root.exists(),
    release: Callable[[Path], None] = lambda _root: None,
    node_labels: Callable[[], Mapping[str, str] | None] = lambda: None,
    wait_node_labels: Callable[[], Awaitable[Mapping[str, str] | None]] | None = None,
    cluster_version: Callable[[], str | None] = lambda: None,
    space_note: Callable[[], str] = lambda: "",
    is_ignoring_target: bool = False,
    is_allowing_rollback: bool = False,
    is_allowing_expired: bool = False,
) -> Importer:
    """The importer; the ``is_*`` overrides are ``bundle import``'s flags (never the daemon's)."""
    transient = config.specs_transient_dirs[0] if config.specs_transient_dirs else None
    platform = node_platform(os.uname().machine)
    ports = ImporterPorts(
        verify=lambda root: check_for_import(
            root, config.bundles.trusted_keys_dir, platform, fips_switch=config.bundles.fips_switch
        ),
        runtime=cri,
        make_server=served_bundle(config, arrival_wait_s=ARRIVAL_WAIT_S),
        mirror=mirror_dropin(config),
        reloader=reloader,
        make_puller=lambda: _local_puller(cri, policies),
        space=StatvfsSpace(),
        specs=SpecDirs(config.specs_persistent_dir, transient or config.specs_persistent_dir),
        store=JsonStateStore(config.state.dir),
        is_present_on_media=is_present,
        on_report=report,
        image_store=node_store(config),
        release_medium=release,
        is_probing_mirror=True,
        node_labels=node_labels,
        wait_node_labels=wait_node_labels,
        cluster_version=cluster_version,
        space_note=space_note,
        is_ignoring_target=is_ignoring_target,
        accepted=lambda: accepted_stamps(
            config.store_dir,
            config.bundles.trusted_keys_dir,
            fips_switch=config.bundles.fips_switch,
        ),
        is_allowing_rollback=is_allowing_rollback,
        is_allowing_expired=is_allowing_expired,
        make_signed_server=served_bundle(config, arrival_wait_s=ARRIVAL_WAIT_S),
        sigstore=RegistriesD(config.runtime.registries_d_dir),
        platform=platform,
    )
    return Importer(ports, policies.disk)


def mirror_dropin(config: Config) -> MirrorDropin:
    """The loopback mirror's drop-in, restating the runtime's registries.conf entries."""
    runtime = config.runtime
    dropin = runtime.registries_dir / config.bundles.mirror_dropin_name
    return MirrorDropin(dropin, runtime.registries_conf)


def signature_publisher(config: Config, api: Any | None) -> SignaturePublisher:
    """A release bundle's signatures to the CVO: applied with ``api`` (cluster mode), else
    a journal line that says how to apply them by hand."""
    bundles = config.bundles
    source = StoredSignatures(
        config.store_dir, bundles.trusted_keys_dir, fips_switch=bundles.fips_switch
    )
    return SignaturePublisher(source, ConfigMaps(api) if api is not None else None)


def with_release_signatures(
    config: Config,
    report: Callable[[BundleReport], None],
    api: Any | None,
    spawn: Callable[..., object],
) -> Callable[[BundleReport], None]:
    """``report``, and for a release bundle just imported, its signatures published."""
    publisher = signature_publisher(config, api)

    async def publish(bundle_id: str) -> None:
        await publisher.publish(bundle_id)

    def on_report(found: BundleReport) -> None:
        report(found)
        if is_due(found):
            spawn(f"release-signatures {found.bundle_id}", publish(found.bundle_id))

    return on_report


def with_self_update(
    config: Config,
    report: Callable[[BundleReport], None],
    spawn: Callable[..., object],
    environ: Mapping[str, str] = os.environ,
) -> Callable[[BundleReport], None]:
    """``report``, and for a bundle just imported that carries a newer nodeagent image, that
    image checked and staged for the host's loader (the container variant, decision 0074).
    The RPM's daemon (no ``NODEAGENT_IMAGE``) never stages anything."""
    running = running_digest(environ)
    if running is None:
        return report
    bundles = config.bundles
    stager = AgentImageStager(
        config.store_dir,
        bundles.trusted_keys_dir,
        bundles.image_keys_dir,
        bundles.agent_image_dir,
        fips_switch=bundles.fips_switch,
    )

    async def update(bundle_id: str) -> None:
        await asyncio.to_thread(stage_self_update, stager, bundle_id, running)

    def on_report(found: BundleReport) -> None:
        report(found)
        if found.state == "imported" and not found.is_already_imported:
            spawn(f"self-update {found.bundle_id}", update(found.bundle_id))

    return on_report


def stage_self_update(stager: AgentImageStager, bundle_id: str, running: str) -> Path | None:
    """Check a stored bundle's ``agentImage`` and stage it; every outcome is one journal line
    (``agent_image_staged``, ``agent_image_current``, ``agent_image_refused``,
    ``agent_image_stage_failed``). The staged directory, or None."""
    try:
        agent = stager.agent_image(bundle_id)
        if agent is None:
            return None
        checked = stager.check(agent, running)
        if checked is None:
            log.info("agent_image_current", bundle=bundle_id, image=agent.manifest_digest)
            return None
        statement, key = checked
        staged = stager.stage(agent, statement)
    except (ImageStageFailed, StoreError, HostFileError) as exc:
        log.error("agent_image_stage_failed", bundle=bundle_id, reason=exc.reason, error=str(exc))
        return None
    except NodeAgentError as exc:
        log.warning("agent_image_refused", bundle=bundle_id, reason=exc.reason, error=str(exc))
        return None
    log.info(
        "agent_image_staged",
        bundle=bundle_id,
        image=agent.manifest_digest,
        version=statement.version,
        sequence=statement.sequence,
        key=key,
        staged=str(staged),
    )
    return staged


def build_registry_store(
    config: Config,
    registry: RegistryClient,
    credentials_for: Callable[[str], RegistryCredentials | None],
) -> RegistrySets:
    """``[store] registry_sets``: registry sets' blobs fetched once into the node's store, by
    the daemon's registry client (its credentials, insecure hosts and registries.conf routes)."""
    platform = node_platform(os.uname().machine)
    limits = node_store(config).limits
    return RegistrySets(config.store_dir, registry, credentials_for, platform, limits)


def build_restorer(
    config: Config,
    policies: Policies,
    cri: CriClient,
    reloader: Reloader,
    metrics: Metrics = NO_METRICS,
) -> StoreRestorer:
    """Images back from the node's store through the same loopback server and mirror."""
    launcher = session_launcher(config)

    def served(
        root: Path, blobs: Mapping[str, ExpectedFile], tags: Mapping[str, str] | None = None
    ) -> SessionServer:
        return SessionServer(
            launcher, root, blobs, tags, on_closed=functools.partial(_restored, metrics)
        )

    session = MirrorPullPorts(
        runtime=cri,
        mirror=mirror_dropin(config),
        reloader=reloader,
        make_puller=lambda: PrePuller(
            cri, lambda _ref: None, policies.bundle_pull, on_event=_log_restore_pull
        ),
        is_probing=True,
    )
    return StoreRestorer(
        node_store(config), served, session, make_signed_server=served,
        sigstore=RegistriesD(config.runtime.registries_d_dir),
    )  # fmt: skip
