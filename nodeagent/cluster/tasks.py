"""Cluster mode's two tasks: sets from the API server in, the node's status out.

Both reach the API server through the ``api.KubeApi`` port (the daemon builds the adapter
only when ``[cluster] enabled``). Two long-lived tasks:

* ``ClusterSpecs.run`` follows the Node, the MachineConfigPools (when the cluster has them)
  and the PinnedImageSets with list-then-watch informers, decides which sets apply to this
  node (``placement``) and keeps them as spec files in ``Config.cluster_specs_dir``. The
  daemon's inotify watch on that directory starts a sync, so the rest of nodeagent does not
  know whether a set came from a file or the cluster. The files are left alone until every
  informer has listed once: an unreachable API server never empties the node's specs.
* ``StatusReporter.run`` (in ``cluster.reporter``) applies the node's status object
  (server-side apply, field manager ``nodeagent``) at most once per
  ``status_interval_s``, with a heartbeat while pulls run; while the API is unreachable
  the latest status waits (later ones replace it) and the Events wait in a bounded queue;
  both are written when it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import random
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
import yaml

from nodeagent.cluster import kinds
from nodeagent.cluster.api import KubeApi, Obj, SpecMirror
from nodeagent.cluster.ownership import Ownership, api_sets_owner
from nodeagent.cluster.placement import (
    CACHE_HEADER,
    Placement,
    cache_file_name,
    place,
    set_document,
)
from nodeagent.config import Config
from nodeagent.errors import ApiUnreachable, NodeAgentError, PoolMembershipInvalid
from nodeagent.selectors import parse_selector

log = structlog.get_logger(__name__)

BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 30.0
MAX_QUEUED_EVENTS = 50
POOLS_RECHECK_S = 300.0
"""Without the MachineConfigPool API, look again this often whether it appeared."""


def node_name(config: Config) -> str:
    return config.cluster.node_name or socket.gethostname().split(".")[0].lower()


def now_text() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class Backoff:
    delay_s: float = BACKOFF_INITIAL_S

    def next(self) -> float:
        delay = self.delay_s * random.uniform(0.8, 1.2)  # noqa: S311  jitter, not crypto
        self.delay_s = min(self.delay_s * 2, BACKOFF_MAX_S)
        return delay

    def reset(self) -> None:
        self.delay_s = BACKOFF_INITIAL_S


@dataclass
class Connection:
    """Whether the API server answers; logs each change once (MESSAGE_ID api_unreachable)."""

    server: str
    is_up: bool = True

    def down(self, error: NodeAgentError) -> None:
        if self.is_up:
            log.warning(
                "api_unreachable",
                server=self.server,
                reason=error.reason,
                error=error.message,
                action="working from the last known PinnedImageSets; status is queued",
            )
        self.is_up = False

    def up(self) -> None:
        if not self.is_up:
            log.info("api_reachable", server=self.server)
        self.is_up = True


# ---------------------------------------------------------------- specs in


@dataclass
class _View:
    node: Obj | None = None
    pools: dict[str, Obj] | None = None
    sets: dict[str, Obj] | None = None
    has_pools: bool | None = None
    listed: set[str] = field(default_factory=set)


class ClusterSpecs:
    """Keeps ``cluster_specs_dir`` equal to the sets the cluster assigns to this node."""

    def __init__(
        self,
        config: Config,
        api: KubeApi,
        connection: Connection,
        *,
        mirror: SpecMirror,
        on_node: Callable[[Obj], None],
        on_placement: Callable[[Placement], None],
        on_ownership: Callable[[Ownership], None] = lambda _: None,
        on_pools: Callable[[dict[str, Obj] | None], None] = lambda _: None,
    ) -> None:
        self.config = config
        self.api = api
        self.mirror = mirror
        self.connection = connection
        self.node = node_name(config)
        self.selector = parse_selector(config.cluster.set_selector)
        self.on_node = on_node
        self.on_placement = on_placement
        self.on_ownership = on_ownership
        self.on_pools = on_pools
        """Told the MachineConfigPools at each change (None: not served), for retirement."""
        self.ownership: Ownership | None = None
        self.view = _View()
        self.changed = asyncio.Event()
        self.placement: Placement | None = None
        self.node_known = asyncio.Event()
        """Set while the informer has this Node (its labels are known)."""

    def node_labels(self) -> dict[str, str] | None:
        """This Node's labels as last listed or watched; None before the API gave them."""
        node = self.view.node
        if node is None:
            return None
        labels = (node.get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}

    async def wait_node_labels(self) -> dict[str, str] | None:
        """This Node's labels, waited for up to the cluster's request timeout when the informer
        has not listed them yet, or the Node is not registered yet (a stick plugged in at boot
        is not refused for want of them); None when they did not come in time."""
        if not self.node_known.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.cluster.request_timeout_s):
                    await self.node_known.wait()
        return self.node_labels()

    async def read_node_labels(self) -> dict[str, str] | None:
        """This Node's labels listed once (``bundle import`` outside the daemon); None when the
        API does not answer in time or has no such Node."""
        fields = f"metadata.name={self.node}"
        try:
            async with asyncio.timeout(self.config.cluster.request_timeout_s):
                async for snapshot in self.api.informer(kinds.NODE, field_selector=fields):
                    self.view.node = snapshot.get(self.node)
                    break
        except (NodeAgentError, TimeoutError) as exc:
            log.warning("node_labels_unknown", node=self.node, error=str(exc) or "timed out")
            return None
        return self.node_labels()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._follow("node", kinds.NODE, f"metadata.name={self.node}"))
            group.create_task(self._follow("sets", kinds.PINNED_IMAGE_SET, None))
            group.create_task(self._follow("pools", kinds.MACHINE_CONFIG_POOL, None))
            group.create_task(self._place_loop())

    async def _follow(self, key: str, kind: kinds.ResourceKind, fields: str | None) -> None:
        backoff = Backoff()
        while True:
            try:
                if key == "pools" and not await self._pools_served():
                    await asyncio.sleep(POOLS_RECHECK_S)
                    continue
                async for snapshot in self.api.informer(kind, field_selector=fields):
                    backoff.reset()
                    self.connection.up()
                    self._store(key, snapshot)
            except NodeAgentError as exc:
                if isinstance(exc, ApiUnreachable):
                    self.connection.down(exc)
                else:
                    log.error(
                        "api_watch_failed", kind=str(kind), reason=exc.reason, error=exc.message
                    )
            await asyncio.sleep(backoff.next())

    async def _pools_served(self) -> bool:
        has_pools = await self.api.is_served(kinds.MACHINE_CONFIG_POOL)
        if has_pools != self.view.has_pools:
            log.info(
                "placement_mode",
                mode="pools" if has_pools else "selector",
                selector=str(self.selector),
            )
        self.view.has_pools = has_pools
        if not has_pools:
            self.view.listed.add("pools")
            self.changed.set()
            self.on_pools(None)
        return has_pools

    def _store(self, key: str, snapshot: dict[str, Obj]) -> None:
        if key == "node":
            self.view.node = snapshot.get(self.node)
            if self.view.node is None:
                self.node_known.clear()
            else:
                self.node_known.set()
                self.on_node(self.view.node)
        elif key == "pools":
            self.view.pools = snapshot
            self.on_pools(snapshot)
        else:
            self.view.sets = snapshot
        self.view.listed.add(key)
        self.changed.set()

    async def _place_loop(self) -> None:
        while True:
            await self.changed.wait()
            self.changed.clear()
            if self.view.listed >= {"node", "sets", "pools"}:
                await asyncio.to_thread(self._place)

    def _place(self) -> None:
        view = self.view
        if view.node is None:
            log.warning(
                "node_not_found",
                node=self.node,
                action="keeping the last known PinnedImageSets; set [cluster] node_name",
            )
            return
        labels = (view.node.get("metadata") or {}).get("labels") or {}
        pools = list((view.pools or {}).values()) if view.has_pools else None
        try:
            placement = place(labels, pools, view.sets or {}, self.selector, node_name=self.node)
        except PoolMembershipInvalid as exc:
            self._refuse_pools(exc)
            return
        if placement.message and placement.message != (self.placement and self.placement.message):
            log.warning("pool_ignored", node=self.node, note=placement.message)
        ownership = self._ownership(view.node)
        if not ownership.is_ours:  # the machine-config-daemon pins them (decision 0044)
            placement = dataclasses.replace(placement, sets=(), missing=())
        files = {
            cache_file_name(name): _spec_file(name, (view.sets or {})[name])
            for name in placement.sets
        }
        changed = self.mirror(self.config.cluster_specs_dir, files, suffix=".yaml")
        if placement != self.placement or changed:
            log.info(
                "cluster_sets_changed",
                placement=placement.describe(),
                sets=list(placement.sets),
                missing=list(placement.missing),
                files_changed=changed,
            )
        self.placement = placement
        self.on_placement(placement)

    def _refuse_pools(self, exc: PoolMembershipInvalid) -> None:
        """Keep the last known sets (nothing is unpinned for a labelling mistake), say why."""
        previous = self.placement or Placement("pools", (), ())
        refused = dataclasses.replace(previous, reason=exc.reason, message=exc.message)
        if refused != self.placement:
            log.error(
                "pool_membership_invalid",
                node=self.node,
                reason=exc.reason,
                error=exc.message,
                action="keeping the last known PinnedImageSets until the node is in one "
                "custom pool at most",
            )
        self.placement = refused
        self.on_placement(refused)

    def _ownership(self, node: Obj) -> Ownership:
        """Who pins the API's sets now; logged and passed on when it changes."""
        mode = self.config.cluster.api_sets
        ownership = api_sets_owner(mode, node, has_pools=bool(self.view.has_pools))
        if ownership != self.ownership:
            action = (
                "pinning the PinnedImageSets of the API"
                if ownership.is_ours
                else "leaving the API's PinnedImageSets to the machine-config-daemon; "
                "bundles and local sets stay nodeagent's"
            )
            log.info("api_sets_owner", owner=ownership.owner, why=ownership.why, action=action)
            self.ownership = ownership
            self.on_ownership(ownership)
        return ownership


def _spec_file(name: str, obj: Mapping[str, Any]) -> bytes:
    text = yaml.safe_dump(set_document(obj), sort_keys=True, default_flow_style=False)
    return (CACHE_HEADER.format(name=name) + text).encode()
