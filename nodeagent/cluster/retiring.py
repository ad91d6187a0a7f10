"""The retirement task: unpin old release bundles once an upgrade has finished everywhere.

``ReleaseRetirer.run`` follows the ClusterVersion ``version`` with a list-then-watch
informer (get/list/watch only; in the daemon it is told each object by
``version_watch.ClusterVersionWatch`` instead, one watch for both) and is given the
MachineConfigPools by ``ClusterSpecs`` (which already follows them: no second watch).
Whenever either changes, and every ``RECHECK_S`` (a release bundle imported meanwhile), it
judges (``rollout`` then
``retirement.plan``) and unpins what the plan retires through the ``ReleaseStore`` port
(``adapters.store.releases``). The store collects the blobs after the grace period; the
signed manifests stay. While the rollout has not finished, or the input is odd, nothing
is retired and the journal says why, once per change.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, Protocol

import structlog

from nodeagent.cluster import kinds
from nodeagent.cluster.api import KubeApi, Obj
from nodeagent.cluster.clusterversion import CLUSTER_VERSION_NAME, REASON_INVALID
from nodeagent.cluster.retirement import (
    RELEASE_VERSION_INVALID,
    RELEASES_RETIRED,
    Plan,
    plan,
    space_note,
)
from nodeagent.cluster.rollout import rollout
from nodeagent.cluster.tasks import POOLS_RECHECK_S, Backoff, Connection
from nodeagent.errors import ApiUnreachable, NodeAgentError
from nodeagent.releases import HeldRelease

log = structlog.get_logger(__name__)

RECHECK_S: Final = 60.0
"""Judge again this often without a change from the API (a release bundle imported)."""
_ODD_INPUT: Final = frozenset({REASON_INVALID, RELEASE_VERSION_INVALID})


class ReleaseStore(Protocol):
    """The release bundles the node holds, and unpinning one (blocking; run in a thread)."""

    def held(self) -> tuple[HeldRelease, ...]: ...

    def unpin(self, held: HeldRelease) -> list[Path]: ...


class ReleaseRetirer:
    def __init__(
        self,
        api: KubeApi,
        connection: Connection,
        store: ReleaseStore,
        *,
        keep_releases: int,
        recheck_s: float = RECHECK_S,
        on_plan: Callable[[Plan], None] = lambda _: None,
        is_following: bool = True,
    ) -> None:
        self.api = api
        self.connection = connection
        self.store = store
        self.keep_releases = keep_releases
        self.recheck_s = recheck_s
        self.on_plan = on_plan
        self.is_following = is_following
        """Follow ClusterVersion itself; False: ``set_cluster_version`` is told each object
        (the daemon shares ``version_watch.ClusterVersionWatch``'s watch)."""
        self.cluster_version: Obj | None = None
        self.is_listed = False
        self.pools: list[Obj] | None = None
        self.changed = asyncio.Event()
        self.said: tuple[str, str] | None = None
        self.is_served: bool | None = None
        self.last: Plan | None = None
        """The last judgement (``space_note`` reads it for a bundle refused for space)."""

    def space_note(self) -> str:
        """``retirement.space_note`` of the last judgement."""
        return space_note(self.last)

    def set_pools(self, pools: Mapping[str, Obj] | None) -> None:
        """The MachineConfigPools as last listed (None: the API does not serve them)."""
        self.pools = None if pools is None else list(pools.values())
        self.changed.set()

    def set_cluster_version(self, obj: Obj | None) -> None:
        """The ClusterVersion as last listed or watched (None: it does not exist)."""
        self.cluster_version = obj
        self.is_listed = True
        self.changed.set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            if self.is_following:
                group.create_task(self._follow())
            group.create_task(self._judge_loop())

    async def _follow(self) -> None:
        backoff = Backoff()
        fields = f"metadata.name={CLUSTER_VERSION_NAME}"
        while True:
            try:
                if not await self._is_served():
                    await asyncio.sleep(POOLS_RECHECK_S)
                    continue
                informer = self.api.informer(kinds.CLUSTER_VERSION, field_selector=fields)
                async for snapshot in informer:
                    backoff.reset()
                    self.connection.up()
                    self.set_cluster_version(snapshot.get(CLUSTER_VERSION_NAME))
            except NodeAgentError as exc:
                if isinstance(exc, ApiUnreachable):
                    self.connection.down(exc)
                else:
                    log.error(
                        "api_watch_failed",
                        kind=str(kinds.CLUSTER_VERSION),
                        reason=exc.reason,
                        error=exc.message,
                    )
            await asyncio.sleep(backoff.next())

    async def _is_served(self) -> bool:
        """Whether the cluster has ClusterVersion (OpenShift); said once when it has not."""
        is_served = await self.api.is_served(kinds.CLUSTER_VERSION)
        if not is_served and self.is_served is not False:
            log.info(
                "cluster_version_not_served",
                action="no ClusterVersion (not OpenShift): no release bundle is retired",
            )
        self.is_served = is_served
        return is_served

    async def _judge_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.recheck_s):
                    await self.changed.wait()
            self.changed.clear()
            if self.is_listed:
                await self.judge()

    async def judge(self) -> Plan:
        """Judge now and unpin what the plan retires; the plan."""
        held = await asyncio.to_thread(self.store.held)
        result = plan(rollout(self.cluster_version, self.pools), held, self.keep_releases)
        for release in result.retire:
            removed = await asyncio.to_thread(self.store.unpin, release)
            log.info(
                "release_retired",
                bundle=release.bundle_id,
                version=release.version,
                set=release.set_name,
                files=[str(p) for p in removed],
                keep_releases=self.keep_releases,
                message=f"unpinned release {release.version} (PinnedImageSet "
                f"{release.set_name}); its blobs go after the store's grace period, its "
                "signed manifest stays",
            )
        self._say(result)
        self.last = result
        self.on_plan(result)
        return result

    def _say(self, result: Plan) -> None:
        said = (result.reason, result.message)
        if said == self.said or result.reason == RELEASES_RETIRED:
            self.said = said
            return
        self.said = said
        if result.reason in _ODD_INPUT:
            log.warning(
                "release_retirement_held",
                reason=result.reason,
                message=result.message,
                action="no release is retired until the ClusterVersion reads right",
            )
        else:
            log.info("release_retirement_waiting", reason=result.reason, message=result.message)
