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
* a release bundle's signature files (``release_files``), checked against ``files[]``;
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

import structlog

from nodeagent.bundles import minisign
from nodeagent.bundles.manifest import MAX_MANIFEST_BYTES
from nodeagent.errors import BundleFetchFailed, NodeAgentError, PeerAnswerInvalid
from nodeagent.progress import ProgressMeter
from nodeagent.site.discovery import PeerView
from nodeagent.site.fetching import FetchSchedule, SignedBundle
from nodeagent.site.follow import FollowDecision, decide
from nodeagent.site.release_files import fetch_release_files
from nodeagent.site.transfer import MESSAGE_CHARS, FetcherPorts, FetchRun
from nodeagent.status import BundleReport
from nodeagent.strict import clip
from nodeagent.units import format_bytes

log = structlog.get_logger(__name__)

SIGNATURE_NAME: Final = "bundle.json.minisig"
MANIFEST_NAME: Final = "bundle.json"
PENDING: Final = "fetched-imports"
"""The state document of fetched bundles waiting for their import."""


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


class BundleFetcher:
    """Looks at the peers' offers and fetches what this node follows, one bundle at a time."""

    def __init__(self, ports: FetcherPorts, *, concurrency: int) -> None:
        self.ports = ports
        self.concurrency = concurrency
        self._memo: dict[tuple[str, str], _Memo] = {}
        self._resumed = False
        self._imports: dict[tuple[str, str], SignedBundle] = {}
        """Fetched bundles whose import did not end imported: tried again."""
        self._import_failures: dict[tuple[str, str], int] = {}
        self._import_due: dict[tuple[str, str], float] = {}

    # ------------------------------------------------------------ looking
    async def look(self, peers: Sequence[PeerView]) -> None:
        """One look at the peers: resume, then fetch each followed bundle not held."""
        store = self.ports.store
        if not self._resumed:
            for signed in await asyncio.to_thread(store.unfinished):
                log.info("bundle_fetch_resumed", bundle=signed.manifest.bundle_id)
                holders = await self._holders(peers, signed.manifest.bundle_id)
                found = holders.get(signed.manifest_digest, ())
                await self._attempt(signed, found, _others(peers, found))
            await self._import_pending()
            self._resumed = True
        for key, signed in list(self._imports.items()):
            if self.ports.clock() >= self._import_due.get(key, 0.0):
                await self._import(signed)
        held = await asyncio.to_thread(store.held)
        for offer in offers(await self._views(peers)):
            key = (offer.bundle_id, offer.manifest_digest)
            if held.get(offer.bundle_id) == (offer.manifest_digest, True):
                continue
            if not self._is_due(key):
                continue
            # an unfinished fetch of this very manifest is not "held": it is resumed
            facts_held = {i: d for i, (d, _) in held.items() if (i, d) != key}
            await self._consider(offer, facts_held, _others(peers, offer.holders))
            held = await asyncio.to_thread(store.held)

    async def _import_pending(self) -> None:
        """Bundles fetched whole whose import a restart cut off: imported now."""
        for bundle_id, digest in sorted(self._pending().items()):
            signed = await asyncio.to_thread(self.ports.store.stored_signed, bundle_id)
            if signed is None or signed.manifest_digest != digest:
                self._set_pending(bundle_id, None)
                continue
            log.info("bundle_import_resumed", bundle=bundle_id)
            await self._import(signed)

    def _pending(self) -> dict[str, str]:
        """Bundle id → manifest digest of each fetched bundle not imported yet."""
        if self.ports.state is None:
            return {}
        try:
            doc = self.ports.state.load(PENDING) or {}
        except NodeAgentError as err:
            log.warning("state_file_damaged", file=PENDING, reason=err.reason)
            self.ports.state.set_aside(PENDING)
            return {}
        found = doc.get("bundles")
        if not isinstance(found, dict):
            return {}
        return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}

    def _set_pending(self, bundle_id: str, digest: str | None) -> None:
        if self.ports.state is None:
            return
        pending = self._pending()
        if digest is None:
            pending.pop(bundle_id, None)
        else:
            pending[bundle_id] = digest
        try:
            self.ports.state.save(PENDING, {"bundles": pending})
        except NodeAgentError as err:  # a full state disk: the import still runs now
            log.warning("state_not_saved", file=PENDING, reason=err.reason, error=err.message)

    def _is_due(self, key: tuple[str, str]) -> bool:
        memo = self._memo.get(key)
        return memo is None or self.ports.clock() >= memo.until_s

    async def _views(self, peers: Sequence[PeerView]) -> dict[str, list[tuple[str, str]]]:
        """What each peer holds: published, else asked, all peers side by side (one that
        fails is left out)."""
        asked = await asyncio.gather(*(self._view(view) for view in peers))
        return {view.address: held for view, held in zip(peers, asked, strict=True) if held}

    async def _view(self, view: PeerView) -> list[tuple[str, str]] | None:
        if view.bundles is not None:
            return [(b.bundle_id, b.manifest_digest) for b in view.bundles]
        try:
            holdings = await self.ports.client.holdings(view.address)
        except NodeAgentError as err:
            log.debug("peer_holdings_unavailable", peer=view.address, reason=err.reason)
            return None
        if self.ports.own_node and holdings.node == self.ports.own_node:
            return None  # this node itself, listed under an address it does not listen on
        return [(b.bundle_id, b.manifest_digest) for b in holdings.bundles]

    async def _holders(self, peers: Sequence[PeerView], bundle_id: str) -> dict[str, list[str]]:
        holders: dict[str, list[str]] = {}
        for address, held in (await self._views(peers)).items():
            for held_id, digest in held:
                if held_id == bundle_id:
                    holders.setdefault(digest, []).append(address)
        return holders

    async def _consider(self, offer: Offer, held: dict[str, str], others: Sequence[str]) -> None:
        key = (offer.bundle_id, offer.manifest_digest)
        signed = await self._signed(offer)
        if signed is None:
            return
        accepted = await asyncio.to_thread(self.ports.store.accepted)
        facts = replace(self.ports.facts(held), accepted=accepted, now_s=self.ports.wall_clock())
        decision = decide(signed.manifest, signed.manifest_digest, facts, signed.key_id_hex)
        if not decision.is_following:
            self._skip(key, decision)
            return
        await self._attempt(signed, offer.holders, others)

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
            address, bundle_id, SIGNATURE_NAME, minisign.MAX_SIGNATURE_BYTES
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
    async def _attempt(
        self, signed: SignedBundle, holders: Sequence[str], others: Sequence[str] = ()
    ) -> None:
        manifest = signed.manifest
        key = (manifest.bundle_id, signed.manifest_digest)
        try:
            await self.fetch(signed, holders, others)
        except NodeAgentError as err:
            self._refused(key, manifest.bundle_id, err, event="bundle_fetch_failed")
            return
        self._memo.pop(key, None)
        self._set_pending(manifest.bundle_id, signed.manifest_digest)
        await self._import(signed)

    async def _import(self, signed: SignedBundle) -> None:
        """Import and pin from the store; one that does not end imported (the runtime down,
        no space for the images) is tried again at later looks, with backoff."""
        bundle_id = signed.manifest.bundle_id
        key = (bundle_id, signed.manifest_digest)
        try:
            report = await self.ports.import_bundle(signed, _source(bundle_id))
        except NodeAgentError as err:
            message = clip(err.message, MESSAGE_CHARS)
            report = BundleReport(
                _source(bundle_id),
                "rejected",
                bundle_id=bundle_id,
                reason=err.reason,
                message=message,
            )
            self.ports.report(report)
        if report.state == "imported":
            for found in (self._imports, self._import_failures, self._import_due):
                found.pop(key, None)
            self._set_pending(bundle_id, None)
            return
        self._imports[key] = signed
        failures = self._import_failures.get(key, 0) + 1
        self._import_failures[key] = failures
        first, most = self.ports.timings.retry_after_s
        wait_s = min(most, first * 2 ** (failures - 1))
        self._import_due[key] = self.ports.clock() + wait_s
        level = log.warning if failures == 1 else log.debug  # said once, then quietly
        level(
            "bundle_fetched_not_imported",
            bundle=bundle_id,
            state=report.state,
            reason=report.reason,
            retry_in_s=round(wait_s),
        )

    async def fetch(
        self, signed: SignedBundle, holders: Sequence[str], others: Sequence[str] = ()
    ) -> None:
        """Fetch every missing blob of ``signed`` from ``holders`` into the store; ``others``,
        the peers that did not hold it when the fetch began, are asked at each refresh and
        used as soon as they hold blobs of it (nodes that start together feed each other:
        with the holders alone they all fetched from node 0, bench/fanout)."""
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
        peers = [*holders, *(a for a in others if a not in holders)]
        schedule = FetchSchedule.start(missing, peers, concurrency=self.concurrency)
        run = FetchRun(self.ports, signed, schedule, meter, base)
        await run.run()
        self.ports.received(run.received)
        extra = await fetch_release_files(self.ports.client, manifest, peers)
        await asyncio.to_thread(store.finish, signed, extra)
        seconds = self.ports.clock() - started_s
        log.info(
            "bundle_fetched",
            bundle=manifest.bundle_id,
            bytes=format_bytes(run.received),
            received_bytes=run.received,
            seconds=round(seconds, 1),
            from_peers=",".join(sorted(run.sources)) or "none (already stored)",
        )
        final = meter.finish(self.ports.clock())
        self.ports.report(
            replace(base, state="stored", progress=final.to_json(), progress_text=final.describe())
        )


def _others(peers: Sequence[PeerView], holders: Sequence[str]) -> list[str]:
    """The peers' addresses not among ``holders``."""
    return [view.address for view in peers if view.address not in holders]


def _source(bundle_id: str) -> str:
    """The bundle board's key of a fetched bundle."""
    return f"peers:{bundle_id}"
