"""The node's status object written to the API: ``StatusReporter``, coalesced and paced.

It writes the NodeImageStatus (``objects.status_object``: every write compared and paced by
``objects.WritePacer``), the Events of set transitions, and, while nodeagent owns the API's
sets (``ownership``, decision 0044), the MachineConfigNode mirror
(``machine_config_node``). A write that fails with the API unreachable marks the
connection down (``tasks.Connection``) and is tried again with backoff.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from nodeagent import __version__
from nodeagent.cluster import kinds
from nodeagent.cluster.api import KubeApi, Obj
from nodeagent.cluster.machine_config_node import machine_config_node_status
from nodeagent.cluster.objects import (
    NodeEvent,
    NodeIdentity,
    WritePacer,
    event_object,
    owner_object,
    status_object,
    transitions,
)
from nodeagent.cluster.ownership import Ownership
from nodeagent.cluster.placement import Placement
from nodeagent.cluster.tasks import Backoff, Connection, node_name, now_text
from nodeagent.config import Config
from nodeagent.errors import ApiUnreachable, NodeAgentError
from nodeagent.status import NodeStatus, PullProgress

log = structlog.get_logger("nodeagent.cluster.tasks")

MAX_QUEUED_EVENTS = 50


class StatusReporter:
    """Writes the node's status object, coalesced; Events on set transitions."""

    def __init__(
        self,
        config: Config,
        api: KubeApi,
        connection: Connection,
        *,
        progress: Callable[[], PullProgress],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.api = api
        self.connection = connection
        self.progress = progress
        self.clock = clock
        self.identity = NodeIdentity(node_name(config), "")
        cluster = config.cluster
        self.pacer = WritePacer(
            cluster.status_interval_s, cluster.heartbeat_s, cluster.progress_interval_s
        )
        self.status: NodeStatus | None = None
        self.final: NodeStatus | None = None
        self.placement: Placement | None = None
        self.events: collections.deque[NodeEvent] = collections.deque(maxlen=MAX_QUEUED_EVENTS)
        self.dirty = asyncio.Event()
        self.conditions: list[Mapping[str, Any]] = []
        self.mcn_conditions: list[Mapping[str, Any]] = []
        self.ownership: Ownership | None = None
        """Who owns the API sets; the MachineConfigNode is mirrored only while it is us."""
        self._has_object = False
        self.writes = 0

    # called by the daemon ------------------------------------------------
    def update(self, status: NodeStatus, *, is_final: bool) -> None:
        self.status = status
        if is_final:
            if self.config.cluster.events:
                self.events.extend(transitions(self.final, status))
            self.final = status
        self.dirty.set()

    def poke(self) -> None:
        self.dirty.set()

    def set_node(self, node: Obj) -> None:
        uid = str((node.get("metadata") or {}).get("uid", ""))
        if uid and uid != self.identity.uid:
            self.identity = NodeIdentity(self.identity.name, uid)
            self._has_object = False
            self.dirty.set()

    def set_ownership(self, ownership: Ownership) -> None:
        self.ownership = ownership
        self.dirty.set()

    def set_placement(self, placement: Placement) -> None:
        if placement != self.placement:
            self.placement = placement
            self.dirty.set()

    # the task -------------------------------------------------------------
    async def run(self) -> None:
        backoff = Backoff()
        while True:
            body = self._body()
            delay = None
            if body is not None:
                # A new owner (the Node's uid learnt) is written even if the status is not.
                is_owner_due = not self._has_object
                is_changed = self.pacer.is_changed(body) or is_owner_due
                delay = self.pacer.delay(
                    self.clock(),
                    is_changed=is_changed,
                    is_busy=self.progress().is_busy,
                    is_milestone=is_owner_due or (is_changed and self.pacer.is_milestone(body)),
                )
            if body is None or delay is None or delay > 0:
                self.dirty.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self.dirty.wait()
                continue
            try:
                await self._write(body)
            except NodeAgentError as exc:
                if isinstance(exc, ApiUnreachable):
                    self.connection.down(exc)
                else:
                    log.error("status_write_failed", reason=exc.reason, error=exc.message)
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            self.connection.up()

    def _body(self) -> dict[str, Any] | None:
        if self.status is None:
            return None
        return status_object(
            self.identity,
            self.status,
            self.progress(),
            placement=self.placement,
            previous_conditions=self.conditions,
            now=now_text(),
            agent_version=__version__,
        )

    async def _write(self, body: dict[str, Any]) -> None:
        kind = kinds.NODE_IMAGE_STATUS
        if not self._has_object:
            identity = self.identity
            await self.api.apply(kind, owner_object(identity))
            # set_node may have learnt the uid while that apply was on its way: apply again.
            self._has_object = identity == self.identity
        written = await self.api.apply(kind, body, subresource="status")
        self.writes += 1
        self.pacer.written(self.clock(), body)
        self.conditions = list((written.get("status") or {}).get("conditions") or [])
        await self._flush_events()
        if self.is_mirroring_mcn() and self.final is not None:
            await self._mirror_mcn(self.final)

    def is_mirroring_mcn(self) -> bool:
        """Asked for, and nodeagent owns the API sets (known: not before the first placement)."""
        owner = self.ownership
        return self.config.cluster.machine_config_node and owner is not None and owner.is_ours

    async def _flush_events(self) -> None:
        while self.events:
            event = self.events[0]
            body = event_object(
                self.identity, event, namespace=self.config.cluster.event_namespace, now=now_text()
            )
            await self.api.create(kinds.EVENT, body)
            self.events.popleft()

    async def _mirror_mcn(self, status: NodeStatus) -> None:
        sets = self.placement.sets if self.placement is not None else ()
        conditions = self.mcn_conditions
        body = machine_config_node_status(self.identity, status, sets, conditions, now_text())
        written = await self.api.apply(kinds.MACHINE_CONFIG_NODE, body, subresource="status")
        self.mcn_conditions = list((written.get("status") or {}).get("conditions") or [])
