"""Cluster mode's adapters and tasks, built only when ``[cluster] enabled``.

Imported lazily by ``wiring`` so that a node without a cluster never loads lightkube.
With ``[site] serve`` or ``follow`` on, discovery's tasks too (decision 0029): the
publisher of this node's holdings and the watcher of its peers'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from nodeagent.adapters.files import mirror_directory
from nodeagent.adapters.kube import KubeApi
from nodeagent.cluster.api import Obj
from nodeagent.cluster.holdings import HeldBundle
from nodeagent.cluster.objects import FIELD_MANAGER
from nodeagent.cluster.readiness import PullGate
from nodeagent.cluster.reporter import StatusReporter
from nodeagent.cluster.retiring import ReleaseRetirer, ReleaseStore
from nodeagent.cluster.starting import UpgradeStarter
from nodeagent.cluster.tasks import ClusterSpecs, Connection, node_name
from nodeagent.cluster.version_watch import ClusterVersionWatch
from nodeagent.config import Config
from nodeagent.daemon.supervisor import Task
from nodeagent.releases import pinned_digests
from nodeagent.reporting import ClusterSink
from nodeagent.site.publishing import BundleStepsTrigger, HoldingsPublisher, PeerWatcher
from nodeagent.site.roles import is_following, is_publishing
from nodeagent.status import PullProgress

if TYPE_CHECKING:
    from nodeagent.adapters.store.holdings import StoreHoldings
    from nodeagent.daemon.releases import LazyReleases

log = structlog.get_logger(__name__)


class LazyHoldings:
    """``site.publishing.HoldingsSource`` that loads the store's code only once the store
    holds a bundle (an idle node in cluster mode does not import it)."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = store_dir
        self._built: StoreHoldings | None = None

    def scan(self) -> tuple[HeldBundle, ...]:
        if self._built is None:
            try:
                if not any((self.store_dir / "bundles").iterdir()):
                    return ()
            except FileNotFoundError:
                return ()
            from nodeagent.adapters.store.holdings import StoreHoldings  # noqa: PLC0415

            self._built = StoreHoldings(self.store_dir)
        return self._built.scan()


@dataclass
class ClusterMode:
    api: KubeApi
    reporter: StatusReporter
    specs: ClusterSpecs
    sink: ClusterSink
    """What the Reporter writes the status to (the reporter, poking the publisher)."""
    gate: PullGate
    """Whether registry pulls may start, and their pace, from the Node (``cluster.readiness``)."""
    publisher: HoldingsPublisher | None = None
    peers: PeerWatcher | None = None
    """The peer directory the fetcher reads (``site.discovery.PeerDirectory``)."""
    version_watch: ClusterVersionWatch | None = None
    """The cluster's ClusterVersion (``cluster.version_watch``): the importer's path check."""
    retirer: ReleaseRetirer | None = None
    """Unpins old release bundles once an upgrade finished (``cluster.retiring``), told each
    ClusterVersion by ``version_watch``."""
    starter: UpgradeStarter | None = None
    """``[upgrade] start = "when-site-ready"``: the one-touch upgrade (``cluster.starting``)."""

    @classmethod
    def build(
        cls, config: Config, *, progress: Callable[[], PullProgress], releases: LazyReleases
    ) -> ClusterMode:
        api = KubeApi(
            config.cluster.kubeconfig,
            timeout_s=config.cluster.request_timeout_s,
            field_manager=FIELD_MANAGER,
        )
        connection = Connection(api.server)
        reporter = StatusReporter(config, api, connection, progress=progress)
        publisher, peers = _discovery(config, api, connection)

        gate = PullGate(config.cluster.control_plane_pull_pause_s)

        def on_node(node: Obj) -> None:
            reporter.set_node(node)
            gate.observe(node)
            if publisher is not None:
                publisher.set_node(node)

        retirer = ReleaseRetirer(
            api,
            connection,
            releases,
            keep_releases=config.upgrade.keep_releases,
            is_following=False,
        )
        specs = ClusterSpecs(
            config,
            api,
            connection,
            mirror=mirror_directory,
            on_node=on_node,
            on_placement=reporter.set_placement,
            on_ownership=reporter.set_ownership,
            on_pools=retirer.set_pools,
        )
        log.info("cluster_mode", server=api.server, node=specs.node, selector=str(specs.selector))
        sink = reporter if publisher is None else BundleStepsTrigger(reporter, publisher)
        version_watch = ClusterVersionWatch(
            api, connection, pinned_digests=lambda: pinned_digests(reporter.status)
        )
        version_watch.listeners.append(retirer.set_cluster_version)
        starter = _starter(config, api, connection, retirer.store, specs.node)
        return cls(
            api, reporter, specs, sink, gate, publisher, peers, version_watch, retirer, starter
        )

    def tasks(self, request_sync: Callable[[], None]) -> list[Task]:
        """Optional tasks: an API server that misbehaves never stops pinning. A change of the
        registry pull terms (the Node Ready again, say) calls ``request_sync``."""
        tasks = [
            Task("cluster-specs", self.specs.run, is_critical=False),
            Task("cluster-status", self.reporter.run, is_critical=False),
            Task("pull-gate", lambda: self.gate.follow(request_sync), is_critical=False),
        ]
        if self.version_watch is not None:
            tasks.append(Task("cluster-version", self.version_watch.run, is_critical=False))
        if self.retirer is not None:
            tasks.append(Task("release-retirement", self.retirer.run, is_critical=False))
        if self.starter is not None:
            tasks.append(Task("upgrade-start", self.starter.run, is_critical=False))
        if self.publisher is not None:
            tasks.append(Task("site-holdings", self.publisher.run, is_critical=False))
        if self.peers is not None:
            tasks.append(Task("site-peers", self.peers.run, is_critical=False))
        return tasks

    async def close(self) -> None:
        await self.api.close()


def _starter(
    config: Config, api: KubeApi, connection: Connection, store: ReleaseStore, node: str
) -> UpgradeStarter | None:
    """The one-touch starter, only with ``[upgrade] start = "when-site-ready"``."""
    if config.upgrade.start != "when-site-ready":
        return None
    from nodeagent.daemon.bundles import signature_publisher  # noqa: PLC0415

    publisher = signature_publisher(config, api)
    log.info("upgrade_start_enabled", node=node, mode=config.upgrade.start)
    return UpgradeStarter(api, connection, store, node=node, publish_signatures=publisher.publish)


def _discovery(
    config: Config, api: KubeApi, connection: Connection
) -> tuple[HoldingsPublisher | None, PeerWatcher | None]:
    node = node_name(config)
    site = config.site
    publisher = (
        HoldingsPublisher(
            api,
            connection,
            LazyHoldings(config.store_dir),
            node=node,
            is_serving=site.serve,
            listen=site.listen,
            advertise=site.advertise,
        )
        if is_publishing(config)
        else None
    )
    peers = (
        PeerWatcher(api, connection, node=node, static_peers=site.peers)
        if is_following(config)
        else None
    )
    return publisher, peers
