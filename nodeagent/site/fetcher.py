"""The fetcher: bundles this node follows, copied from its peers into its store, then imported
and pinned from the store exactly as after a stick (docs/site.md, "Fetch").

``BundleFetcher.look`` takes the peers' view (``discovery.PeerView``; a static peer's
holdings are asked over HTTPS), finishes first what a previous run left unfinished (a
bundle directory with its signed manifest and no record), then, per bundle id a peer
offers that this node does not hold: the signed manifest and its signature from a peer
holding it, verified against this node's own keys (``FetchStorePort.verify``; a peer is
never trusted), the follow rule (``follow.decide``), the store's admission, and the
fetch itself, one bundle at a time:

* the blobs still missing, scheduled over the peers holding that manifest
  (``fetching.FetchSchedule``), ``[site] fetch_concurrency`` at once, each verified by
  digest and size before it is stored (and from then on served to other peers);
* each peer's ``have`` (which blobs it holds) and load (``uploads.active``) asked again
  every ``have_refresh_s`` while the fetch runs;
* a peer that fails, stalls, sends wrong bytes or a garbage answer is dropped for that
  bundle (``bundle_fetch_peer_dropped``); one that answers 429/503 is asked again after
  its ``Retry-After``; no peer left, or no progress for ``stall_s``: ``NoPeerLeft``, the
  bundle is tried again later (backoff, ``retry_after_s``), resuming what is stored.

A decision not to follow, a signature that does not verify and a store that refuses are
reported once per bundle and manifest (journal and status) and looked at again after
``recheck_s`` (keys or space may change). Ports: ``PeerClientPort``
(``adapters.http.client``), ``FetchStorePort`` (``adapters.store.fetched``); the import is
the importer's ``import_stored``, handed in by the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Protocol

import structlog

from nodeagent.bundles.manifest import MAX_MANIFEST_BYTES, BundleManifest
from nodeagent.errors import (
    BundleFetchFailed,
    NodeAgentError,
    PeerAnswerInvalid,
    PeerBusy,
    PeerUnreachable,
    StoreSourceMismatch,
)
from nodeagent.progress import ProgressMeter
from nodeagent.site.discovery import PeerView
from nodeagent.site.fetching import FetchSchedule, SignedBundle, held_digests
from nodeagent.site.follow import FollowDecision, NodeFacts, decide
from nodeagent.site.holdings import Have, Holdings
from nodeagent.status import BundleReport
from nodeagent.strict import clip
from nodeagent.units import format_bytes

log = structlog.get_logger(__name__)

SIGNATURE_NAME: Final = "bundle.json.minisig"
MANIFEST_NAME: Final = "bundle.json"
MAX_SIGNATURE_BYTES: Final = 16 << 10
MESSAGE_CHARS: Final = 1000
PEER_FAULTS: Final = (PeerUnreachable, PeerAnswerInvalid, StoreSourceMismatch)
"""What a peer did wrong (it is dropped); any other error of a blob stops the fetch."""


class PeerClientPort(Protocol):
    async def holdings(self, address: str) -> Holdings: ...

    async def have(self, address: str, bundle_id: str) -> Have: ...

    async def bundle_file(
        self, address: str, bundle_id: str, name: str, max_bytes: int
    ) -> bytes: ...

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

    def verify(self, data: bytes, signature: bytes) -> SignedBundle: ...

    def held(self) -> dict[str, tuple[str, bool]]:
        """Bundle id → (digest of its stored ``bundle.json``, whether it has a record)."""
        ...

    def unfinished(self) -> list[SignedBundle]: ...

    def missing(self, manifest: BundleManifest) -> dict[str, int]: ...

    def begin(self, signed: SignedBundle) -> int: ...

    async def fill(
        self,
        digest: str,
        size_bytes: int,
        download: Download,
        on_bytes: Callable[[int], None] = ...,
    ) -> None: ...

    def finish(self, signed: SignedBundle) -> None: ...


@dataclass(frozen=True, slots=True)
class FetchTimings:
    have_refresh_s: float = 3.0
    stall_s: float = 60.0
    """No blob stored and none in flight for this long: the fetch fails (``NoPeerLeft``)."""
    retry_after_s: tuple[float, float] = (10.0, 300.0)
    """A failed fetch is tried again after the first, doubling up to the second."""
    recheck_s: float = 300.0


@dataclass(frozen=True, slots=True)
class Offer:
    """One bundle as the peers offer it: the manifest digest most of them hold, and who."""

    bundle_id: str
    manifest_digest: str
    holders: tuple[str, ...]


def offers(views: Mapping[str, Sequence[tuple[str, str]]]) -> list[Offer]:
    """Peer address → (bundle id, manifest digest) it holds, as offers by bundle id; a
    bundle held under several digests is offered with the one most peers hold."""
    by_id: dict[str, dict[str, list[str]]] = {}
    for address, held in views.items():
        for bundle_id, digest in held:
            by_id.setdefault(bundle_id, {}).setdefault(digest, []).append(address)
    found = []
    for bundle_id in sorted(by_id):
        digest, holders = max(by_id[bundle_id].items(), key=lambda kv: (len(kv[1]), kv[0]))
        found.append(Offer(bundle_id, digest, tuple(sorted(holders))))
    return found


@dataclass(slots=True)
class _Memo:
    """Per (bundle id, manifest digest): when to look again, and the failure count."""

    until_s: float
    failures: int = 0


@dataclass
class FetcherPorts:
    client: PeerClientPort
    store: FetchStorePort
    facts: Callable[[dict[str, str]], NodeFacts]
    """This node's facts for the follow rule, given what the store holds."""
    import_bundle: Callable[[SignedBundle, str], Awaitable[BundleReport]]
    """Import and pin from the store (the importer's ``import_stored``), by source name."""
    report: Callable[[BundleReport], None] = lambda _r: None
    clock: Callable[[], float] = time.monotonic
    timings: FetchTimings = field(default_factory=FetchTimings)


class BundleFetcher:
    """Looks at the peers' offers and fetches what this node follows, one bundle at a time."""

    def __init__(self, ports: FetcherPorts, *, concurrency: int) -> None:
        self.ports = ports
        self.concurrency = concurrency
        self._memo: dict[tuple[str, str], _Memo] = {}
        self._resumed = False

    # ------------------------------------------------------------ looking
    async def look(self, peers: Sequence[PeerView]) -> None:
        """One look at the peers: resume, then fetch each followed bundle not held."""
        store = self.ports.store
        if not self._resumed:
            for signed in await asyncio.to_thread(store.unfinished):
                log.info("bundle_fetch_resumed", bundle=signed.manifest.bundle_id)
                holders = await self._holders(peers, signed.manifest.bundle_id)
                await self._attempt(signed, holders.get(signed.manifest_digest, ()))
            self._resumed = True
        for offer in offers(await self._views(peers)):
            held = await asyncio.to_thread(store.held)
            key = (offer.bundle_id, offer.manifest_digest)
            if held.get(offer.bundle_id) == (offer.manifest_digest, True):
                continue
            if not self._is_due(key):
                continue
            # an unfinished fetch of this very manifest is not "held": it is resumed
            facts_held = {i: d for i, (d, _) in held.items() if (i, d) != key}
            await self._consider(offer, facts_held)

    def _is_due(self, key: tuple[str, str]) -> bool:
        memo = self._memo.get(key)
        return memo is None or self.ports.clock() >= memo.until_s

    async def _views(self, peers: Sequence[PeerView]) -> dict[str, list[tuple[str, str]]]:
        """What each peer holds: published, else asked (a peer that fails is left out)."""
        found: dict[str, list[tuple[str, str]]] = {}
        for view in peers:
            if view.bundles is not None:
                found[view.address] = [(b.bundle_id, b.manifest_digest) for b in view.bundles]
                continue
            try:
                holdings = await self.ports.client.holdings(view.address)
            except NodeAgentError as err:
                log.debug("peer_holdings_unavailable", peer=view.address, reason=err.reason)
                continue
            found[view.address] = [(b.bundle_id, b.manifest_digest) for b in holdings.bundles]
        return found

    async def _holders(self, peers: Sequence[PeerView], bundle_id: str) -> dict[str, list[str]]:
        holders: dict[str, list[str]] = {}
        for address, held in (await self._views(peers)).items():
            for held_id, digest in held:
                if held_id == bundle_id:
                    holders.setdefault(digest, []).append(address)
        return holders

    async def _consider(self, offer: Offer, held: dict[str, str]) -> None:
        key = (offer.bundle_id, offer.manifest_digest)
        signed = await self._signed(offer)
        if signed is None:
            return
        decision = decide(signed.manifest, signed.manifest_digest, self.ports.facts(held))
        if not decision.is_following:
            self._skip(key, decision)
            return
        await self._attempt(signed, offer.holders)

    async def _signed(self, offer: Offer) -> SignedBundle | None:
        """The manifest and signature from the first holder that sends a pair that verifies
        as the digest offered; None (reported) when none does."""
        key = (offer.bundle_id, offer.manifest_digest)
        last: NodeAgentError | None = None
        for address in offer.holders:
            try:
                signed = await self._signed_from(address, offer.bundle_id)
            except NodeAgentError as err:
                last = err
                continue
            if signed.manifest_digest == offer.manifest_digest:
                return signed
            last = PeerAnswerInvalid(f"peer {address} sent another bundle.json than it offers")
        if last is not None:
            self._refused(key, offer.bundle_id, last, event="bundle_fetch_refused")
        return None

    async def _signed_from(self, address: str, bundle_id: str) -> SignedBundle:
        client = self.ports.client
        data = await client.bundle_file(address, bundle_id, MANIFEST_NAME, MAX_MANIFEST_BYTES)
        signature = await client.bundle_file(
            address, bundle_id, SIGNATURE_NAME, MAX_SIGNATURE_BYTES
        )
        signed = await asyncio.to_thread(self.ports.store.verify, data, signature)
        if signed.manifest.bundle_id != bundle_id:
            raise PeerAnswerInvalid(f"peer {address} sent the manifest of another bundle id")
        return signed

    def _skip(self, key: tuple[str, str], decision: FollowDecision) -> None:
        if key not in self._memo:
            log.info(
                "bundle_not_followed",
                bundle=clip(key[0], 128),
                reason=decision.reason,
                message=decision.message,
            )
        self._memo[key] = _Memo(self.ports.clock() + self.ports.timings.recheck_s)

    def _refused(
        self, key: tuple[str, str], bundle_id: str, err: NodeAgentError, *, event: str
    ) -> None:
        memo = self._memo.get(key)
        failures = 1 if memo is None else memo.failures + 1
        first, most = self.ports.timings.retry_after_s
        wait_s = min(most, first * 2 ** (failures - 1))
        if isinstance(err, BundleFetchFailed) or memo is None:
            log.warning(
                event,
                bundle=clip(bundle_id, 128),
                reason=err.reason,
                error=clip(err.message, MESSAGE_CHARS),
                retry_in_s=round(wait_s),
            )
        self._memo[key] = _Memo(self.ports.clock() + wait_s, failures)
        self.ports.report(
            BundleReport(
                _source(bundle_id),
                "rejected",
                bundle_id=bundle_id,
                reason=err.reason,
                message=clip(err.message, MESSAGE_CHARS),
            )
        )

    # ------------------------------------------------------------ fetching
    async def _attempt(self, signed: SignedBundle, holders: Sequence[str]) -> None:
        manifest = signed.manifest
        key = (manifest.bundle_id, signed.manifest_digest)
        try:
            await self.fetch(signed, holders)
        except NodeAgentError as err:
            self._refused(key, manifest.bundle_id, err, event="bundle_fetch_failed")
            return
        self._memo.pop(key, None)
        report = await self.ports.import_bundle(signed, _source(manifest.bundle_id))
        if report.state != "imported":
            log.info("bundle_fetched_not_imported", bundle=manifest.bundle_id, state=report.state)

    async def fetch(self, signed: SignedBundle, holders: Sequence[str]) -> None:
        """Fetch every missing blob of ``signed`` from ``holders`` into the store."""
        store, manifest = self.ports.store, signed.manifest
        total = sum(f.size_bytes for f in manifest.blobs.values())
        base = BundleReport(
            _source(manifest.bundle_id),
            "fetching",
            bundle_id=manifest.bundle_id,
            signed_by=signed.signed_by,
            images_total=len(manifest.images),
            bytes_total=total,
        )
        await asyncio.to_thread(store.begin, signed)
        missing = await asyncio.to_thread(store.missing, manifest)
        started_s = self.ports.clock()
        meter = ProgressMeter(total, started_s, done_bytes=total - sum(missing.values()))
        self.ports.report(replace(base, progress=meter.snapshot(started_s).to_json()))
        log.info(
            "bundle_fetch_started",
            bundle=manifest.bundle_id,
            peers=",".join(holders) or "none",
            blobs=len(missing),
            bytes=format_bytes(sum(missing.values())),
        )
        schedule = FetchSchedule.start(missing, holders, concurrency=self.concurrency)
        run = _FetchRun(self, signed, schedule, meter, base)
        await run.run()
        await asyncio.to_thread(store.finish, signed)
        seconds = self.ports.clock() - started_s
        log.info(
            "bundle_fetched",
            bundle=manifest.bundle_id,
            bytes=format_bytes(run.received),
            seconds=round(seconds, 1),
            from_peers=",".join(sorted(run.sources)) or "none (already stored)",
        )
        final = meter.finish(self.ports.clock())
        self.ports.report(
            replace(base, state="stored", progress=final.to_json(), progress_text=final.describe())
        )


def _source(bundle_id: str) -> str:
    """The bundle board's key of a fetched bundle."""
    return f"peers:{bundle_id}"


class _FetchRun:
    """One bundle's blobs: the schedule, the requests in flight, the have refreshes."""

    def __init__(
        self,
        fetcher: BundleFetcher,
        signed: SignedBundle,
        schedule: FetchSchedule,
        meter: ProgressMeter,
        base: BundleReport,
    ) -> None:
        self.fetcher, self.signed, self.schedule = fetcher, signed, schedule
        self.meter, self.base = meter, base
        self.ordered = sorted(signed.manifest.blobs)
        self.tasks: dict[asyncio.Task[None], tuple[str, str]] = {}
        self.received = 0
        self.sources: set[str] = set()
        self.last_progress_s = fetcher.ports.clock()
        self.loop = asyncio.get_running_loop()

    @property
    def ports(self) -> FetcherPorts:
        return self.fetcher.ports

    async def run(self) -> None:
        timings = self.ports.timings
        next_refresh_s = 0.0
        try:
            while not self.schedule.is_complete:
                now_s = self.ports.clock()
                if now_s >= next_refresh_s:
                    await self.refresh()
                    next_refresh_s = self.ports.clock() + timings.have_refresh_s
                self.start_blobs()
                self.check_blocked()
                wait_s = max(0.05, next_refresh_s - self.ports.clock())
                retry_s = self.schedule.next_retry_s(now_s)
                if retry_s is not None:
                    wait_s = min(wait_s, max(0.05, retry_s - now_s))
                await self.wait(wait_s)
        finally:
            for task in self.tasks:
                task.cancel()
            for task in list(self.tasks):
                with contextlib.suppress(BaseException):
                    await task

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

    async def refresh(self) -> None:
        """Every usable peer's ``have`` and load, side by side."""
        peers = [p for p in self.schedule.peers.values() if p.dropped is None]
        await asyncio.gather(*(self._refresh_one(p.address) for p in peers))

    async def _refresh_one(self, address: str) -> None:
        client, bundle_id = self.ports.client, self.signed.manifest.bundle_id
        try:
            have = await client.have(address, bundle_id)
            holdings = await client.holdings(address)
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
        )

    def drop(self, address: str, err: NodeAgentError) -> None:
        if self.schedule.drop(address, err.reason):
            log.warning(
                "bundle_fetch_peer_dropped",
                bundle=self.signed.manifest.bundle_id,
                peer=address,
                reason=err.reason,
                error=clip(err.message, MESSAGE_CHARS),
            )

    def start_blobs(self) -> None:
        for digest, address in self.schedule.assign(self.ports.clock()):
            task = asyncio.create_task(self.fetch_blob(digest, address))
            self.tasks[task] = (digest, address)

    async def fetch_blob(self, digest: str, address: str) -> None:
        size = self.signed.manifest.blobs[digest].size_bytes

        async def download(offset: int, write: Callable[[bytes], Awaitable[None]]) -> int:
            got = await self.ports.client.blob(
                address, digest, offset=offset, size_bytes=size, write=write
            )
            self.received += got
            return got

        await self.ports.store.fill(digest, size, download, self.count)

    def count(self, count: int) -> None:
        """Bytes written (a worker thread): the progress goes to the loop."""
        self.loop.call_soon_threadsafe(self.show, count)

    async def wait(self, wait_s: float) -> None:
        if not self.tasks:
            await asyncio.sleep(wait_s)
        else:
            await asyncio.wait(set(self.tasks), timeout=wait_s, return_when="FIRST_COMPLETED")
        for task in [t for t in self.tasks if t.done()]:
            digest, address = self.tasks.pop(task)
            self.settle(task, digest, address)

    def settle(self, task: asyncio.Task[None], digest: str, address: str) -> None:
        err = task.exception()
        if err is None:
            self.schedule.stored(digest)
            self.sources.add(address)
            self.last_progress_s = self.ports.clock()
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
