"""The one-touch upgrade: one agent starts it once the site is ready (``[upgrade] start``).

With ``start = "when-site-ready"`` (and deploy/opt-in/upgrade-start.yaml applied),
``UpgradeStarter.run`` follows the ClusterVersion, the Nodes and every NodeImageStatus with
list-then-watch informers and asks ``one_touch.decide`` at each change and every
``RECHECK_S``. When it says ``SiteReady``:

1. the node Leases elect one agent: the kubelet of every node renews its Lease in
   ``kube-node-lease``; the first node by name whose Lease is fresh (renewed within its
   ``leaseDurationSeconds``) is the one that starts. A node may hold no other Lease (the
   NodeRestriction admission plugin), so the election reads the ones the kubelets keep;
2. it reads the ClusterVersion again and decides again (the informer may lag);
3. applies the release's signature ConfigMap (``SignaturePublisher.publish``: the CVO
   verifies the release from it before it upgrades);
4. sets ``spec.desiredUpdate`` to the release image by digest and its version (a JSON merge
   patch that clears ``force`` and ``architecture``, with the ``resourceVersion`` it read as
   a precondition: should two agents disagree on the election, only one write lands),
   which the admission policies of the opt-in check again;
5. says who started it and why: the journal (``upgrade_started``) and an Event on its Node
   (reason ``UpgradeStarted``, ``oc get events -n default --field-selector
   reason=UpgradeStarted``), the same message.

Anything that goes wrong is logged with a reason code and tried again at the next change:
nothing here stops pinning (an optional task).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, Protocol

import structlog

from nodeagent.cluster import kinds
from nodeagent.cluster.api import Obj
from nodeagent.cluster.clusterversion import CLUSTER_VERSION_NAME
from nodeagent.cluster.objects import NodeEvent, NodeIdentity, event_object
from nodeagent.cluster.one_touch import SITE_READY, StartDecision, count_ready, decide
from nodeagent.cluster.retiring import ReleaseStore
from nodeagent.cluster.tasks import Backoff, Connection
from nodeagent.errors import ApiUnreachable, NodeAgentError
from nodeagent.releases import HeldRelease, SiteReadiness
from nodeagent.status import Condition
from nodeagent.strict import clip

log = structlog.get_logger(__name__)

CONDITION_TYPE: Final = "UpgradeStart"
"""The status condition that says whether this node started the cluster's upgrade (True,
naming the release and why), or why it has not (False, the decision's reason code)."""

LEASE: Final = kinds.ResourceKind(
    "coordination.k8s.io", "v1", "Lease", "leases", is_namespaced=True
)
NODE_LEASE_NAMESPACE: Final = "kube-node-lease"
"""Where each kubelet renews its node's Lease (named after the node)."""
RECHECK_S: Final = 60.0


class StarterApi(Protocol):
    """What the starter needs of ``adapters.kube.KubeApi``."""

    def informer(
        self, kind: kinds.ResourceKind, *, field_selector: str | None = None
    ) -> AsyncIterator[dict[str, Obj]]: ...

    async def get(
        self, kind: kinds.ResourceKind, name: str, namespace: str | None = None
    ) -> Obj | None: ...

    async def merge_patch(
        self, kind: kinds.ResourceKind, name: str, patch: Obj, namespace: str | None = None
    ) -> Obj: ...

    async def create(self, kind: kinds.ResourceKind, body: Obj) -> Obj: ...


def _now_text() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def lease_is_fresh(lease: Obj, now: dt.datetime) -> bool:
    """The holder renewed it within its duration (unknown or odd is not fresh)."""
    spec = lease.get("spec")
    if not isinstance(spec, dict):
        return False
    renewed, duration = spec.get("renewTime"), spec.get("leaseDurationSeconds")
    if not isinstance(renewed, str) or type(duration) is not int or not 0 < duration <= 3600:
        return False
    try:
        at = dt.datetime.fromisoformat(renewed.replace("Z", "+00:00"))
    except ValueError:
        return False
    if at.tzinfo is None:
        return False
    return now <= at + dt.timedelta(seconds=duration)


class UpgradeStarter:
    def __init__(
        self,
        api: StarterApi,
        connection: Connection,
        store: ReleaseStore,
        *,
        node: str,
        publish_signatures: Callable[[str], Awaitable[bool]],
        recheck_s: float = RECHECK_S,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        event_namespace: str = "default",
    ) -> None:
        self.api = api
        self.connection = connection
        self.store = store
        self.node = node
        self.publish_signatures = publish_signatures
        self.recheck_s = recheck_s
        self.clock = clock
        self.event_namespace = event_namespace
        self.snapshots: dict[str, dict[str, Obj]] = {}
        self.changed = asyncio.Event()
        self.said: tuple[str, str] | None = None
        self.started: list[str] = []
        """Digests this agent set as desiredUpdate (for its status and tests)."""
        self.on_said: Callable[[Condition], None] = lambda _condition: None
        """Given the ``UpgradeStart`` condition each time it changes: the node's status says
        whether this node started the upgrade, or why not yet (the daemon's wiring sets it)."""

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            fields = f"metadata.name={CLUSTER_VERSION_NAME}"
            group.create_task(self._follow("cv", kinds.CLUSTER_VERSION, fields))
            group.create_task(self._follow("nodes", kinds.NODE, None))
            group.create_task(self._follow("statuses", kinds.NODE_IMAGE_STATUS, None))
            group.create_task(self._judge_loop())

    async def _follow(self, key: str, kind: kinds.ResourceKind, fields: str | None) -> None:
        backoff = Backoff()
        while True:
            try:
                async for snapshot in self.api.informer(kind, field_selector=fields):
                    backoff.reset()
                    self.connection.up()
                    self.snapshots[key] = snapshot
                    self.changed.set()
            except NodeAgentError as exc:
                if isinstance(exc, ApiUnreachable):
                    self.connection.down(exc)
                else:
                    log.error(
                        "api_watch_failed", kind=str(kind), reason=exc.reason, error=exc.message
                    )
            await asyncio.sleep(backoff.next())

    async def _judge_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.recheck_s):
                    await self.changed.wait()
            self.changed.clear()
            if {"cv", "nodes", "statuses"} <= set(self.snapshots):
                await self.judge()

    def readiness(self, digest: str) -> SiteReadiness | None:
        """How many nodes have pinned the release of ``digest``, from the Nodes and
        NodeImageStatuses it follows (None until both were listed; decision 0073)."""
        if not {"nodes", "statuses"} <= set(self.snapshots):
            return None
        statuses = self.snapshots["statuses"]
        nodes = {*self.snapshots["nodes"], *statuses}
        ready, total = count_ready(digest, nodes, statuses, this_node=self.node)
        return SiteReadiness(ready, total, "NodeImageStatuses")

    async def _decide(self, cluster_version: Obj | None) -> StartDecision:
        held = await asyncio.to_thread(self.store.held)
        statuses = self.snapshots.get("statuses", {})
        # Every NodeImageStatus counts, with or without its Node: the admission policy takes
        # each one as a param (deploy/opt-in/upgrade-start.yaml), so one left by a removed
        # node must be said here, not met as a refusal at the patch.
        nodes = {*self.snapshots.get("nodes", {}), *statuses}
        return decide(cluster_version, nodes, statuses, held)

    async def judge(self) -> StartDecision:
        decision = await self._decide(self.snapshots.get("cv", {}).get(CLUSTER_VERSION_NAME))
        self._say(decision)
        if decision.reason == SITE_READY and decision.release is not None:
            try:
                await self._start(decision.release)
            except NodeAgentError as exc:
                self._not_started(exc.reason, exc.message)
        return decision

    async def _start(self, release: HeldRelease) -> None:
        if not await self._is_elected():
            return
        fresh = await self.api.get(kinds.CLUSTER_VERSION, CLUSTER_VERSION_NAME)
        again = await self._decide(fresh)
        if fresh is None or again.reason != SITE_READY or again.release != release:
            self._say(again)
            return
        if not await self.publish_signatures(release.bundle_id):
            self._not_started(
                "ReleaseSignaturesNotApplied",
                "the release's signature ConfigMap could not be applied (see "
                "release_signatures_not_applied); the cluster-version operator would refuse it",
            )
            return
        update = {"image": release.image, "version": release.version, "force": None}
        version = (fresh.get("metadata") or {}).get("resourceVersion")
        patch: Obj = {
            "metadata": {"resourceVersion": version},
            "spec": {"desiredUpdate": update | {"architecture": None}},
        }
        await self.api.merge_patch(kinds.CLUSTER_VERSION, CLUSTER_VERSION_NAME, patch)
        self.started.append(release.digest)
        message = (
            f"{self.node} set ClusterVersion's desiredUpdate to release {release.version} "
            f"({release.image}): {again.message}"
        )
        self.on_said(Condition(CONDITION_TYPE, True, "UpgradeStarted", clip(message, 1000)))
        log.info(
            "upgrade_started",
            node=self.node,
            bundle=release.bundle_id,
            version=release.version,
            image=release.image,
            why=again.message,
            message=message,
        )
        await self._event(message)

    async def _event(self, message: str) -> None:
        """An Event on this Node saying who started the upgrade and why (best effort)."""
        node = self.snapshots.get("nodes", {}).get(self.node) or {}
        uid = str((node.get("metadata") or {}).get("uid", ""))
        event = NodeEvent("Normal", "UpgradeStarted", message, "")
        body = event_object(
            NodeIdentity(self.node, uid), event, namespace=self.event_namespace, now=_now_text()
        )
        try:
            await self.api.create(kinds.EVENT, body)
        except NodeAgentError as exc:
            log.warning("event_not_written", reason=exc.reason, error=exc.message)

    async def _is_elected(self) -> bool:
        """This node is the first by name whose kubelet Lease is fresh (``lease_is_fresh``)."""
        now = self.clock()
        for name in sorted(self.snapshots.get("nodes", {})):
            lease = await self.api.get(LEASE, name, NODE_LEASE_NAMESPACE)
            if lease is not None and lease_is_fresh(lease, now):
                if name != self.node:
                    log.info("upgrade_start_left_to_another_node", elected=name)
                return name == self.node
        return False

    def _say(self, decision: StartDecision) -> None:
        said = (decision.reason, decision.message)
        if said != self.said:
            log.info("upgrade_start_waiting", reason=decision.reason, message=decision.message)
            waiting = clip(f"not started by this node: {decision.message}", 1000)
            self.on_said(Condition(CONDITION_TYPE, False, decision.reason, waiting))
        self.said = said

    def _not_started(self, reason: str, message: str) -> None:
        said = clip(f"not started: {message}", 1000)
        self.on_said(Condition(CONDITION_TYPE, False, reason, said))
        log.warning(
            "upgrade_not_started",
            node=self.node,
            reason=reason,
            error=message,
            action="tried again at the next change; or start it by hand: oc adm upgrade",
        )
