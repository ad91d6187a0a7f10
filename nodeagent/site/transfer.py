"""One bundle's blobs, from the peers into the store (``FetchRun``), and the ports it uses.

``FetchRun.run`` drives a ``fetching.FetchSchedule``: it asks every usable peer's ``have``
and load (``uploads.active``) every ``have_refresh_s``, each peer in a task of its own
(a peer slow to answer delays neither the others' refresh nor a blob: the loop never
waits for a refresh; each request is bounded by the client's deadline and minimum rate),
starts the blobs the schedule hands out (each one ``FetchStorePort.fill``: verified by
digest and size before it is stored), and settles each: stored (its rate goes into the
peer's standing); a 429/503 (``PeerBusy``) defers its peer until ``Retry-After``; a peer
fault (``PEER_FAULTS``: it failed, stalled, was too slow, answered garbage or sent wrong
bytes) drops the peer for this bundle (``bundle_fetch_peer_dropped``) and demotes it
(``standing``); any other error (the store's: no space, a write error) stops the fetch.
A straggler is moved (``check_stragglers``): a request that has run ``straggler_s``, is
under the client's minimum rate (``straggler_below_bytes_s``: it would be cut at the end of
its 5 s window anyway) and under ``1/straggler_ratio`` of the rate another peer gives in
this fetch, for a blob another peer holds, is cancelled, its peer dropped as too slow, and
the blob goes to another peer from where it stopped (the store keeps the partial). A peer
sending 1 byte a second costs about ``straggler_s`` instead of the 5 s window.
No peer left, or no progress for ``stall_s`` with nothing in flight: ``BundleFetchFailed``
(``NoPeerLeft``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Protocol

import structlog

from nodeagent.bundles.freshness import Stamp
from nodeagent.bundles.manifest import BundleManifest
from nodeagent.errors import (
    BundleFetchFailed,
    NodeAgentError,
    PeerAnswerInvalid,
    PeerBusy,
    PeerTooSlow,
    PeerUnreachable,
    StoreSourceMismatch,
)
from nodeagent.ports import StateStore
from nodeagent.progress import ProgressMeter
from nodeagent.site.fetching import (
    FetchSchedule,
    SignedBundle,
    fetching_digests,
    held_digests,
)
from nodeagent.site.follow import NodeFacts
from nodeagent.site.holdings import Have, Holdings
from nodeagent.status import BundleReport
from nodeagent.strict import clip
from nodeagent.units import format_bytes

log = structlog.get_logger("nodeagent.site.fetcher")

MESSAGE_CHARS: Final = 1000
PEER_FAULTS: Final = (PeerUnreachable, PeerAnswerInvalid, StoreSourceMismatch)
"""What a peer did wrong (it is dropped); any other error of a blob stops the fetch."""


class PeerClientPort(Protocol):
    async def holdings(self, address: str) -> Holdings: ...

    async def have(self, address: str, bundle_id: str) -> Have: ...

    async def bundle_file(
        self, address: str, bundle_id: str, name: str, max_bytes: int
    ) -> bytes: ...

    async def signature_file(
        self, address: str, bundle_id: str, name: str, max_bytes: int
    ) -> bytes | None:
        """A bundle's signature file; None when the peer has none of that name (404)."""
        ...

    async def blob(
        self,
        address: str,
        digest: str,
        *,
        offset: int,
        size_bytes: int,
        write: Callable[[bytes], Awaitable[None]],
    ) -> int: ...


Download = Callable[[int, Callable[[bytes], Awaitable[None]]], Awaitable[int]]


class FetchStorePort(Protocol):
    """The store as the fetcher writes it; blocking calls except ``fill``."""

    def verify(
        self, data: bytes, signature: bytes | None, ecdsa: bytes | None = None
    ) -> SignedBundle:
        """A peer's manifest and signature files, checked against this node's keys."""
        ...

    def held(self) -> dict[str, tuple[str, bool]]:
        """Bundle id → (digest of its stored ``bundle.json``, whether it has a record)."""
        ...

    def unfinished(self) -> list[SignedBundle]: ...

    def accepted(self) -> tuple[Stamp, ...]:
        """The signed manifests the store keeps, verified again (anti-rollback)."""
        ...

    def stored_signed(self, bundle_id: str) -> SignedBundle | None:
        """A recorded bundle's manifest and signature, verified again; None if not."""
        ...

    def missing(self, manifest: BundleManifest) -> dict[str, int]: ...

    def begin(self, signed: SignedBundle) -> int: ...

    async def fill(
        self,
        digest: str,
        size_bytes: int,
        download: Download,
        on_bytes: Callable[[int], None] = ...,
    ) -> None: ...

    def finish(self, signed: SignedBundle, extra: Mapping[str, bytes] = ...) -> None:
        """Every blob stored: the record; ``extra``, the release signature files (checked)."""
        ...


@dataclass(frozen=True, slots=True)
class FetchTimings:
    have_refresh_s: float = 1.0
    """Each peer's holdings and ``have`` are asked again this often while a fetch runs: a blob
    a peer has just stored is offered on within about a second (its server reads the store
    again after 1 s). Two small requests a second to each peer in use."""
    stall_s: float = 60.0
    """No blob stored and none in flight for this long: the fetch fails (``NoPeerLeft``)."""
    retry_after_s: tuple[float, float] = (10.0, 300.0)
    """A failed fetch is tried again after the first, doubling up to the second."""
    recheck_s: float = 300.0
    straggler_s: float = 1.0
    """A blob request is judged a straggler once it has run this long (a healthy one of a
    few MB on a site's link has ended by then)."""
    straggler_ratio: float = 16.0
    """... has received less than this fraction of the best rate another peer gives ..."""
    straggler_below_bytes_s: float = 64 << 10
    """... and less than this rate: the client's minimum (``[site] fetch_min_rate_bytes``),
    under which the request would be cut at the end of its window anyway. A peer merely
    slower than the best (a busy link, a shared CPU) is never moved."""


@dataclass
class FetcherPorts:
    client: PeerClientPort
    store: FetchStorePort
    facts: Callable[[dict[str, str]], NodeFacts]
    """This node's facts for the follow rule, given what the store holds."""
    import_bundle: Callable[[SignedBundle, str], Awaitable[BundleReport]]
    """Import and pin from the store (the importer's ``import_stored``), by source name."""
    report: Callable[[BundleReport], None] = lambda _r: None
    received: Callable[[int], None] = lambda _bytes: None
    """Given the bytes a fetch received from peers, once it ends (the metrics' count)."""
    own_node: str = ""
    """This node's configured name (``[cluster] node_name``; ``""``: none): a static peer
    whose holdings name it is this node (never asked). Host names are not used: they may
    repeat across nodes (cloned images), and a node must never skip a real peer."""
    state: StateStore | None = None
    """Where fetched bundles wait for their import (``fetched-imports``), so a restart
    between the record and the import still imports them."""
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    """Unix time, for a bundle's ``expires``."""
    timings: FetchTimings = field(default_factory=FetchTimings)


class FetchRun:
    """One bundle's blobs: the schedule, the requests in flight, the have refreshes."""

    def __init__(
        self,
        ports: FetcherPorts,
        signed: SignedBundle,
        schedule: FetchSchedule,
        meter: ProgressMeter,
        base: BundleReport,
    ) -> None:
        self.ports, self.signed, self.schedule = ports, signed, schedule
        self.meter, self.base = meter, base
        self.ordered = sorted(signed.manifest.blobs)
        self.tasks: dict[asyncio.Task[None], tuple[str, str, float]] = {}
        """Blob task → (digest, peer, started at)."""
        self.got: dict[str, int] = {}
        """Digest → bytes its request in flight has received."""
        self.moved: dict[asyncio.Task[None], str] = {}
        """Straggling blob task cancelled → why (``check_stragglers``)."""
        self.refreshing: dict[str, asyncio.Task[None]] = {}
        """Peer → its refresh under way (one at a time per peer)."""
        self.received = 0
        self.sources: set[str] = set()
        self.last_progress_s = ports.clock()
        self.loop = asyncio.get_running_loop()

    async def run(self) -> None:
        timings = self.ports.timings
        next_refresh_s = 0.0
        try:
            while not self.schedule.is_complete:
                now_s = self.ports.clock()
                if now_s >= next_refresh_s:
                    self.refresh()
                    next_refresh_s = self.ports.clock() + timings.have_refresh_s
                self.start_blobs()
                self.check_stragglers()
                self.check_blocked()
                wait_s = max(0.05, next_refresh_s - self.ports.clock())
                retry_s = self.schedule.next_retry_s(now_s)
                if retry_s is not None:
                    wait_s = min(wait_s, max(0.05, retry_s - now_s))
                await self.wait(wait_s)
        finally:
            await reap([*self.tasks, *self.refreshing.values()], self.signed.manifest.bundle_id)

    def check_blocked(self) -> None:
        reason = self.schedule.blocked()
        bundle = self.signed.manifest.bundle_id
        left = format_bytes(self.schedule.bytes_left)
        dropped = "; ".join(f"{a}: {r}" for a, r in sorted(self.schedule.dropped().items()))
        if reason is not None:
            raise BundleFetchFailed(
                f"bundle {bundle}: no peer left to fetch {left} from ({dropped or 'no peers'})"
            )
        idle_s = self.ports.clock() - self.last_progress_s
        if not self.tasks and idle_s >= self.ports.timings.stall_s:
            raise BundleFetchFailed(
                f"bundle {bundle}: no peer has had the missing {left} for {idle_s:.0f} s"
                + (f" (dropped: {dropped})" if dropped else "")
            )

    def refresh(self) -> None:
        """Ask every usable peer's ``have`` and load, each in its own task; a peer whose
        last refresh is still under way is not asked twice."""
        for peer in list(self.schedule.peers.values()):
            if peer.dropped is None and peer.address not in self.refreshing:
                task = asyncio.create_task(self._refresh_one(peer.address))
                self.refreshing[peer.address] = task

    async def _refresh_one(self, address: str) -> None:
        client, bundle_id = self.ports.client, self.signed.manifest.bundle_id
        try:
            holdings = await client.holdings(address)
            if self.ports.own_node and holdings.node == self.ports.own_node:
                self.schedule.forget(address)  # this node, under an address it does not use
                return
            if not _offers(holdings, bundle_id, self.signed.manifest_digest):
                # not (yet) fetching this bundle: asked again at the next refresh
                active = holdings.uploads_active
                self.schedule.learn(
                    address,
                    have=frozenset(),
                    reported_active=active,
                    uploads_max=holdings.uploads_max,
                )
                return
            have = await client.have(address, bundle_id)
            if have.manifest_digest != self.signed.manifest_digest:
                raise PeerAnswerInvalid(f"peer {address} holds another manifest of {bundle_id}")
            if have.blobs != len(self.ordered):
                raise PeerAnswerInvalid(f"peer {address}: have lists {have.blobs} blobs")
        except PeerBusy as err:
            self.schedule.defer(address, self.ports.clock() + err.retry_after_s)
            return
        except NodeAgentError as err:
            self.drop(address, err)
            return
        self.schedule.learn(
            address,
            have=held_digests(have, self.ordered),
            reported_active=holdings.uploads_active,
            fetching=fetching_digests(have, self.ordered),
            uploads_max=holdings.uploads_max,
        )

    def drop(self, address: str, err: NodeAgentError) -> None:
        if self.schedule.drop(address, err.reason):
            demoted_s = self.schedule.standings.failed(address, self.ports.clock())
            log.warning(
                "bundle_fetch_peer_dropped",
                bundle=self.signed.manifest.bundle_id,
                peer=address,
                reason=err.reason,
                error=clip(err.message, MESSAGE_CHARS),
                demoted_s=round(demoted_s),
            )

    def start_blobs(self) -> None:
        for digest, address in self.schedule.assign(self.ports.clock()):
            self.got[digest] = 0
            task = asyncio.create_task(self.fetch_blob(digest, address))
            self.tasks[task] = (digest, address, self.ports.clock())

    def check_stragglers(self) -> None:
        """Cancel each request far slower than another peer's, for a blob another holds."""
        timings, now_s = self.ports.timings, self.ports.clock()
        rates: dict[str, float] = {}
        for digest, address, started_s in self.tasks.values():
            rate = self.got.get(digest, 0) / max(now_s - started_s, 1e-3)
            rates[address] = max(rates.get(address, 0.0), rate)
        for peer in self.schedule.peers.values():  # and what whole blobs came at
            measured = self.schedule.standings.measured([peer.address])
            if peer.dropped is None and measured:
                rates[peer.address] = max(rates.get(peer.address, 0.0), measured[0])
        for task, (digest, address, started_s) in self.tasks.items():
            elapsed_s = now_s - started_s
            if task in self.moved or elapsed_s < timings.straggler_s:
                continue
            rate = self.got.get(digest, 0) / elapsed_s
            best = max((r for a, r in rates.items() if a != address), default=0.0)
            if rate >= timings.straggler_below_bytes_s or rate * timings.straggler_ratio >= best:
                continue
            if not self.schedule.has_other_holder(digest, address):
                continue
            self.moved[task] = (
                f"peer {address} sent {format_bytes(int(rate))}/s of blob {digest[:19]} "
                f"while another peer sends {format_bytes(int(best))}/s: moved there"
            )
            task.cancel()

    async def fetch_blob(self, digest: str, address: str) -> None:
        size = self.signed.manifest.blobs[digest].size_bytes

        async def download(offset: int, write: Callable[[bytes], Awaitable[None]]) -> int:
            async def counted(chunk: bytes) -> None:
                self.got[digest] = self.got.get(digest, 0) + len(chunk)
                await write(chunk)

            got = await self.ports.client.blob(
                address, digest, offset=offset, size_bytes=size, write=counted
            )
            self.received += got
            return got

        await self.ports.store.fill(digest, size, download, self.count)

    def count(self, count: int) -> None:
        """Bytes written (a worker thread): the progress goes to the loop."""
        self.loop.call_soon_threadsafe(self.show, count)

    async def wait(self, wait_s: float) -> None:
        """Until a blob or a refresh ends, or ``wait_s``; then settle what ended."""
        waiting = {*self.tasks, *self.refreshing.values()}
        if not waiting:
            await asyncio.sleep(wait_s)
        else:
            await asyncio.wait(waiting, timeout=wait_s, return_when="FIRST_COMPLETED")
        for address, task in list(self.refreshing.items()):
            if task.done():
                del self.refreshing[address]
                task.result()  # _refresh_one handles every peer error; a bug is raised
        for task in [t for t in self.tasks if t.done()]:
            digest, address, started_s = self.tasks.pop(task)
            self.settle(task, digest, address, started_s)

    def settle(self, task: asyncio.Task[None], digest: str, address: str, started_s: float) -> None:
        self.got.pop(digest, None)
        moved = self.moved.pop(task, None)
        if task.cancelled():  # a straggler moved (the fetch's own end reaps, never settles)
            self.schedule.returned(digest)
            if moved is not None:
                self.drop(address, PeerTooSlow(moved))
            return
        err = task.exception()
        if err is None:
            self.schedule.stored(digest)
            self.sources.add(address)
            now_s = self.ports.clock()
            self.last_progress_s = now_s
            size = self.signed.manifest.blobs[digest].size_bytes
            self.schedule.standings.served(address, size, now_s - started_s)
            return
        self.schedule.returned(digest)
        if isinstance(err, PeerBusy):
            self.schedule.defer(address, self.ports.clock() + err.retry_after_s)
        elif isinstance(err, PEER_FAULTS):
            self.drop(address, err)
        else:  # the store's own failure (no space, a write error): the fetch stops
            raise err

    def show(self, count: int) -> None:
        shown = self.meter.advance(count, self.ports.clock())
        if shown is not None:
            self.ports.report(
                replace(self.base, progress=shown.to_json(), progress_text=shown.describe())
            )


def _offers(holdings: Holdings, bundle_id: str, manifest_digest: str) -> bool:
    """Whether a peer's holdings list this very manifest, complete or being fetched."""
    return any(
        b.bundle_id == bundle_id and b.manifest_digest == manifest_digest for b in holdings.bundles
    )


async def reap(tasks: Sequence[asyncio.Task[None]], bundle: str) -> None:
    """Cancel ``tasks`` and wait for them to end. A task's own failure (a ``NodeAgentError``)
    was reported where it happened; one that ended otherwise (a defect) is said here, never
    passed over. A cancellation of the caller itself goes on up."""
    for task in tasks:
        task.cancel()
    for ended in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(ended, Exception) and not isinstance(ended, NodeAgentError):
            log.error("fetch_task_failed", bundle=bundle, reason="InternalError",
                      error=clip(repr(ended), 300))  # fmt: skip
