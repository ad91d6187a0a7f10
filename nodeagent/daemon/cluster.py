"""Cluster mode's adapters and tasks, built only when ``[cluster] enabled``.

Imported lazily by ``wiring`` so that a node without a cluster never loads lightkube.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from nodeagent.adapters.files import mirror_directory
from nodeagent.adapters.kube import KubeApi
from nodeagent.cluster.objects import FIELD_MANAGER
from nodeagent.cluster.tasks import ClusterSpecs, Connection, StatusReporter
from nodeagent.config import Config
from nodeagent.daemon.supervisor import Task
from nodeagent.status import PullProgress

log = structlog.get_logger(__name__)


@dataclass
class ClusterMode:
    api: KubeApi
    sink: StatusReporter
    specs: ClusterSpecs

    @classmethod
    def build(cls, config: Config, *, progress: Callable[[], PullProgress]) -> ClusterMode:
        api = KubeApi(
            config.cluster.kubeconfig,
            timeout_s=config.cluster.request_timeout_s,
            field_manager=FIELD_MANAGER,
        )
        connection = Connection(api.server)
        reporter = StatusReporter(config, api, connection, progress=progress)
        specs = ClusterSpecs(
            config,
            api,
            connection,
            mirror=mirror_directory,
            on_node=reporter.set_node,
            on_placement=reporter.set_placement,
        )
        log.info("cluster_mode", server=api.server, node=specs.node, selector=str(specs.selector))
        return cls(api, reporter, specs)

    def tasks(self) -> list[Task]:
        """Optional tasks: an API server that misbehaves never stops pinning."""
        return [
            Task("cluster-specs", self.specs.run, is_critical=False),
            Task("cluster-status", self.sink.run, is_critical=False),
        ]

    async def close(self) -> None:
        await self.api.close()
