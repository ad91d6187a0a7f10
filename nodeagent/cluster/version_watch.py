"""The cluster's ClusterVersion, followed (list-then-watch of the one object ``version``).

``ClusterVersionWatch`` keeps the latest ``clusterversion.ClusterVersionView`` for the rest of
the node: the bundle importer's upgrade-path check asks ``current_version`` (None until the
object was listed, on a cluster without ClusterVersion, or while it reads with problems:
nothing is guessed), the status reporter and the metrics ask ``target_digests``. It says in
the journal, once per change:

* ``cluster_version_invalid`` (warning): the object has odd fields (their reason codes);
* ``upgrade_target_not_pinned`` (warning): ClusterVersion asks for a release (its desired
  update) that this node has not pinned (``pinned_digests``, the releases of its bundles
  whose set is pinned); ``upgrade_target_pinned`` once it has.

Reads only (get, list, watch; deploy/rbac.yaml). On a cluster without ClusterVersion (not
OpenShift) it says so once and checks again every ``recheck_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Final

import structlog

from nodeagent.cluster import kinds
from nodeagent.cluster.api import KubeApi, Obj
from nodeagent.cluster.clusterversion import (
    CLUSTER_VERSION_NAME,
    ClusterVersionView,
    parse_cluster_version,
)
from nodeagent.cluster.tasks import Backoff, Connection
from nodeagent.errors import ApiUnreachable, NodeAgentError
from nodeagent.strict import clip

log = structlog.get_logger(__name__)

RECHECK_S: Final = 300.0
"""How often a cluster without ClusterVersion is asked again (as the pools are)."""


class ClusterVersionWatch:
    """The latest ClusterVersion of the cluster, and what this node says about it."""

    def __init__(
        self,
        api: KubeApi,
        connection: Connection,
        pinned_digests: Callable[[], Collection[str]] = frozenset,
        *,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self.api = api
        self.connection = connection
        self.pinned_digests = pinned_digests
        self.recheck_s = recheck_s
        self.object: Obj | None = None
        """The object as last listed or watched (None: none, or not listed yet)."""
        self.view: ClusterVersionView | None = None
        self.listeners: list[Callable[[Obj | None], None]] = []
        """Told each new object (the release retirer may follow the same watch)."""
        self.is_served: bool | None = None
        self._said_problems: tuple[str, ...] = ()
        self._said_target: tuple[str, bool] | None = None

    # ------------------------------------------------------------ what the node asks
    def current_version(self) -> str | None:
        """The cluster's version (its newest Completed release); None when not known."""
        view = self.view
        if view is None or not view.is_usable or view.current is None:
            return None
        return view.current.version

    def target_digests(self) -> frozenset[str]:
        """Digests the cluster is asked or moving to (empty when not known)."""
        return frozenset() if self.view is None else self.view.target_digests()

    def target_versions(self) -> dict[str, str]:
        """Digest -> version of each target (``""`` when ClusterVersion names none)."""
        view = self.view
        if view is None:
            return {}
        versions = {r.digest: r.version for r in (view.desired, view.current) if r is not None}
        if view.history:
            versions[view.history[0].release.digest] = view.history[0].release.version
        if view.desired_update is not None:
            versions[view.desired_update.digest] = view.desired_update.version
        return {digest: versions.get(digest, "") for digest in view.target_digests()}

    # ------------------------------------------------------------ the watch
    async def run(self) -> None:
        backoff = Backoff()
        fields = f"metadata.name={CLUSTER_VERSION_NAME}"
        while True:
            try:
                if not await self._is_served():
                    await asyncio.sleep(self.recheck_s)
                    continue
                async for snapshot in self.api.informer(
                    kinds.CLUSTER_VERSION, field_selector=fields
                ):
                    backoff.reset()
                    self.connection.up()
                    self.observe(snapshot.get(CLUSTER_VERSION_NAME))
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
        is_served = await self.api.is_served(kinds.CLUSTER_VERSION)
        if not is_served and self.is_served is not False:
            log.info(
                "cluster_version_not_served",
                action="no ClusterVersion (not OpenShift): releases are not checked against it",
            )
        self.is_served = is_served
        return is_served

    def observe(self, obj: Obj | None) -> None:
        """A new object (None: it does not exist): keep its view, say what changed."""
        self.object = obj
        self.view = None if obj is None else parse_cluster_version(obj)
        self._say_problems()
        self.check_target()
        for listener in self.listeners:
            listener(obj)

    def _say_problems(self) -> None:
        problems = () if self.view is None else self.view.problems
        said = tuple(f"{p.reason}:{p.field}" for p in problems)
        if said == self._said_problems:
            return
        self._said_problems = said
        if not problems:
            log.info("cluster_version_valid")
            return
        first = problems[0]
        log.warning(
            "cluster_version_invalid",
            reason=first.reason,
            field=first.field,
            error=first.message,
            problems=len(problems),
            action="no release is judged against the cluster's version until it reads right",
        )

    def check_target(self) -> None:
        """Say once when the desired update names a release this node has not pinned (and
        once when it has); call again when the node's pins change."""
        view = self.view
        update = None if view is None else view.desired_update
        if update is None or not update.digest:
            self._said_target = None
            return
        is_pinned = update.digest in set(self.pinned_digests())
        said = (update.digest, is_pinned)
        if said == self._said_target:
            return
        self._said_target = said
        version = clip(update.version, 64) or "unknown"
        if is_pinned:
            log.info("upgrade_target_pinned", digest=update.digest, version=version)
            return
        log.warning(
            "upgrade_target_not_pinned",
            digest=update.digest,
            version=version,
            action="plug in the stick with this release bundle, or wait for `nodeagent site wait`",
        )
