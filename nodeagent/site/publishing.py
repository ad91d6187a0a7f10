"""Discovery's two cluster-mode tasks (decision 0029), through the ``cluster.api.KubeApi`` port.

* ``HoldingsPublisher.run`` keeps the node's NodeImageHoldings equal to what its store
  holds. It follows its own object (list+watch, one name) and rescans the store when
  poked (a bundle's step changed), when that object changes, and every ``rescan_s``; it
  applies the object only when the API server's copy differs in spec or owner. Nothing
  is published before the Node was read (its uid owns the object, its InternalIP is the
  default address).
* ``PeerWatcher.run`` follows every NodeImageHoldings (one list+watch), parses each
  strictly (an invalid one is logged once and left out) and keeps the merged peer view
  (``discovery.merge_peers``) that the fetcher reads through ``discovery.PeerDirectory``.

Both check first that the API server serves NodeImageHoldings (its CRD installed) and
otherwise say so once and look again every ``recheck_s``: discovery never stops pinning.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from nodeagent.cluster import kinds
from nodeagent.cluster.api import KubeApi, Obj
from nodeagent.cluster.holdings import (
    HeldBundle,
    Holdings,
    holdings_object,
    holdings_of,
    is_published,
    object_name,
    parse_holdings,
)
from nodeagent.cluster.objects import NodeIdentity
from nodeagent.cluster.tasks import Backoff, Connection
from nodeagent.errors import ApiUnreachable, NodeAgentError, PeerHoldingsInvalid
from nodeagent.site.discovery import (
    PeerView,
    bundle_steps,
    merge_peers,
    node_address,
    shared_addresses,
)
from nodeagent.status import NodeStatus

log = structlog.get_logger(__name__)

RESCAN_S = 300.0
"""Look at the store this often even without a poke (a removal by the keeper or the CLI)."""
RECHECK_S = 300.0
"""Without the NodeImageHoldings CRD, look again this often whether it was installed."""
CRD_FILE = "deploy/crds/nodeimageholdings.nodeagent.io.yaml"


class HoldingsSource(Protocol):
    """What the store holds (``adapters.store.holdings.StoreHoldings``); blocking."""

    def scan(self) -> tuple[HeldBundle, ...]: ...


class _Snapshot(Protocol):
    def __call__(self, snapshot: dict[str, Obj], /) -> None: ...


class _Served:
    """Whether the API server serves NodeImageHoldings; says each change once."""

    def __init__(self, api: KubeApi, recheck_s: float) -> None:
        self.api = api
        self.recheck_s = recheck_s
        self.was_served: bool | None = None

    async def wait(self) -> None:
        while True:
            served = await self.api.is_served(kinds.NODE_IMAGE_HOLDINGS)
            if served != self.was_served and not served:
                log.warning(
                    "site_holdings_unavailable",
                    server=self.api.server,
                    action=f"a cluster admin applies {CRD_FILE}; until then no peer is "
                    "discovered and this node's holdings are not published",
                )
            self.was_served = served
            if served:
                return
            await asyncio.sleep(self.recheck_s)


async def _follow(
    api: KubeApi,
    connection: Connection,
    served: _Served,
    field_selector: str | None,
    on_snapshot: _Snapshot,
) -> None:
    """List+watch NodeImageHoldings forever, after backoff on each failure."""
    backoff = Backoff()
    while True:
        try:
            await served.wait()
            async for snapshot in api.informer(
                kinds.NODE_IMAGE_HOLDINGS, field_selector=field_selector
            ):
                backoff.reset()
                connection.up()
                on_snapshot(snapshot)
        except NodeAgentError as exc:
            if isinstance(exc, ApiUnreachable):
                connection.down(exc)
            else:
                log.error("site_holdings_watch_failed", reason=exc.reason, error=exc.message)
        await asyncio.sleep(backoff.next())


# ---------------------------------------------------------------- this node's holdings


class HoldingsPublisher:
    """Writes this node's NodeImageHoldings, and only when what it says changed."""

    def __init__(
        self,
        api: KubeApi,
        connection: Connection,
        source: HoldingsSource,
        *,
        node: str,
        is_serving: bool,
        listen: str,
        advertise: str,
        rescan_s: float = RESCAN_S,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self.api = api
        self.connection = connection
        self.source = source
        self.identity = NodeIdentity(node, "")
        self.is_serving = is_serving
        self.listen = listen
        self.advertise = advertise
        self.rescan_s = rescan_s
        self.served = _Served(api, recheck_s)
        self.address = ""
        self.observed: Obj | None = None
        self.is_listed = False
        self.dirty = asyncio.Event()
        self.writes = 0
        """Applies made (each one a change of the object)."""
        self.scans = 0
        """Looks at the store (most find nothing new and write nothing)."""
        self.last: Holdings | None = None
        self._said_no_address = False
        self._failure: str | None = None
        """The reason of the failing publish said last; None: publishing works."""

    # called by the daemon ------------------------------------------------
    def set_node(self, node: Obj) -> None:
        """The Node as its informer saw it: its uid owns the object, its InternalIP is the
        address peers use (unless ``[site] advertise``)."""
        uid = str((node.get("metadata") or {}).get("uid", ""))
        address = node_address(node, listen=self.listen, advertise=self.advertise)
        if uid and (uid, address) != (self.identity.uid, self.address):
            self.identity = NodeIdentity(self.identity.name, uid)
            self.address = address
            self.dirty.set()

    def poke(self) -> None:
        """The store may hold something else now (a bundle stored, fetched or removed)."""
        self.dirty.set()

    # the task -------------------------------------------------------------
    async def run(self) -> None:
        selector = f"metadata.name={self.identity.name}"
        async with asyncio.TaskGroup() as group:
            group.create_task(
                _follow(self.api, self.connection, self.served, selector, self._observe)
            )
            group.create_task(self._publish_loop())

    def _observe(self, snapshot: dict[str, Obj]) -> None:
        self.observed = snapshot.get(self.identity.name)
        self.is_listed = True
        self.dirty.set()

    async def _publish_loop(self) -> None:
        backoff = Backoff()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.rescan_s):
                    await self.dirty.wait()
            self.dirty.clear()
            if not (self.is_listed and self.identity.uid):
                continue
            try:
                await self.publish()
            except NodeAgentError as exc:
                self._failed(exc)
                await asyncio.sleep(backoff.next())
                self.dirty.set()
                continue
            if self._failure is not None:
                log.info("site_holdings_published_again", after=self._failure)
                self._failure = None
            backoff.reset()

    def _failed(self, exc: NodeAgentError) -> None:
        """Say a failure once (and the API server's outage through ``connection``)."""
        if isinstance(exc, ApiUnreachable):
            self.connection.down(exc)
        elif exc.reason != self._failure:
            log.error(
                "site_holdings_not_published",
                reason=exc.reason,
                error=exc.message,
                action="retrying with backoff; peers see this node's last published holdings",
            )
        self._failure = exc.reason

    async def publish(self) -> bool:
        """Scan the store and apply the object if it says something new; True if written."""
        bundles = await asyncio.to_thread(self.source.scan)
        self.scans += 1
        holdings = holdings_of(
            self.identity.name, bundles, is_serving=self.is_serving, address=self.address
        )
        body = holdings_object(self.identity, holdings)
        if is_published(body, self.observed):
            self.last = holdings
            return False
        if self.is_serving and not holdings.address and not self._said_no_address:
            log.warning(
                "site_address_unknown",
                node=self.identity.name,
                action="set [site] advertise: the Node lists no InternalIP",
            )
        self._said_no_address = self.is_serving and not holdings.address
        self.observed = await self.api.apply(kinds.NODE_IMAGE_HOLDINGS, body)
        self.writes += 1
        self.connection.up()
        if holdings != self.last:
            log.info(
                "site_holdings_published",
                bundles=[b.bundle_id for b in holdings.bundles],
                complete=sum(b.is_complete for b in holdings.bundles),
                address=holdings.address,
            )
        self.last = holdings
        return True


class StatusSink(Protocol):
    """The node's status writer (``cluster.reporter.StatusReporter``), as ``reporting`` calls it."""

    def update(self, status: NodeStatus, *, is_final: bool) -> None: ...

    def poke(self) -> None: ...


@dataclass
class BundleStepsTrigger:
    """A ``StatusSink`` in front of the status writer that also pokes the holdings
    publisher when a bundle's step changes (stored, imported, rejected …), never for
    progress: the store is looked at again only when it may hold something else."""

    status: StatusSink
    publisher: HoldingsPublisher
    steps: frozenset[tuple[str, str]] = field(default_factory=frozenset)

    def update(self, status: NodeStatus, *, is_final: bool) -> None:
        self.status.update(status, is_final=is_final)
        steps = bundle_steps(status)
        if steps != self.steps:
            self.steps = steps
            self.publisher.poke()

    def poke(self) -> None:
        self.status.poke()


# ---------------------------------------------------------------- the peers


class PeerWatcher:
    """``discovery.PeerDirectory``: every other node's published holdings plus the static
    ``[site] peers``."""

    def __init__(
        self,
        api: KubeApi,
        connection: Connection,
        *,
        node: str,
        static_peers: Sequence[str],
        recheck_s: float = RECHECK_S,
    ) -> None:
        self.api = api
        self.connection = connection
        self.node = node
        self.static_peers = tuple(static_peers)
        self.served = _Served(api, recheck_s)
        self._view = merge_peers(node, (), self.static_peers)
        self._version = 0
        self._changed = asyncio.Event()
        self._refused: dict[str, str] = {}
        """Node → message of its object last refused (logged once per change)."""
        self._shared: dict[str, list[str]] = {}
        """Address → the nodes claiming it, for each address claimed twice (said once)."""

    def peers(self) -> tuple[PeerView, ...]:
        return self._view

    @property
    def version(self) -> int:
        return self._version

    async def changed(self, since: int) -> int:
        while self._version == since:
            await self._changed.wait()
        return self._version

    async def run(self) -> None:
        await _follow(self.api, self.connection, self.served, None, self.update)

    def update(self, snapshot: dict[str, Obj]) -> None:
        """A new list of every NodeImageHoldings: parse, merge, signal if the view changed."""
        published = []
        refused: dict[str, str] = {}
        for obj in snapshot.values():
            try:
                published.append(parse_holdings(obj))
            except PeerHoldingsInvalid as exc:
                node = object_name(obj) or "?"
                refused[node] = exc.message
                if self._refused.get(node) != exc.message:
                    log.warning(
                        "peer_holdings_invalid", node=node, reason=exc.reason, error=exc.message
                    )
        self._refused = refused
        shared = shared_addresses(published, self.node)
        for address, nodes in sorted(shared.items()):
            if self._shared.get(address) != nodes:
                log.warning(
                    "peer_address_claimed_twice",
                    address=address,
                    nodes=",".join(nodes),
                    action="its holdings are asked from the server at that address itself",
                )
        self._shared = shared
        view = merge_peers(self.node, published, self.static_peers)
        if view != self._view:
            self._view = view
            self._version += 1
            self._changed.set()
            self._changed = asyncio.Event()
            log.info(
                "site_peers_changed",
                peers=[p.node or p.address for p in view],
                version=self._version,
            )
