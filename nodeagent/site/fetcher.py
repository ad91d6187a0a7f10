"""The fetcher: bundles this node follows, copied from its peers into its store, then imported
and pinned from the store exactly as after a stick (docs/site.md, "Fetch").

``BundleFetcher.look`` takes the peers' view (``discovery.PeerView``; a static peer's
holdings are asked over HTTPS, each peer on its own: ``asking``), finishes first what a
previous run left unfinished (a bundle directory with its signed manifest and no record),
then, per bundle id the peers offer that this node does not hold, every manifest digest
offered for it in the order ``offers`` gives (a peer is never trusted: a node with a valid
certificate may publish any id under a digest of its own): the signed manifest and its
signature from a holder, verified against this node's own keys
(``FetchStorePort.verify``; a holder whose pair fails is not asked for that digest again
and is demoted, ``standing``), the follow rule (``follow.decide``), the store's
admission, and the fetch itself, one bundle at a time:

* the blobs still missing, scheduled over the peers holding that manifest
  (``fetching.FetchSchedule``), ``[site] fetch_concurrency`` at once, each verified by
  digest and size before it is stored (and from then on served to other peers);
* a release bundle's signature files (``release_files``), checked against ``files[]``;
* each peer's ``have`` (which blobs it holds) and load (``uploads.active``) asked again
  every ``have_refresh_s`` while the fetch runs;
* a peer that fails, stalls, is too slow (the client's minimum rate and deadlines), sends
  wrong bytes or a garbage answer is dropped for that bundle and demoted
  (``bundle_fetch_peer_dropped``); one that answers 429/503 is asked again after
  its ``Retry-After``; no peer left, or no progress for ``stall_s``: ``NoPeerLeft``, the
  bundle is tried again later (backoff, ``retry_after_s``), resuming what is stored.

A decision not to follow, a signature that does not verify and a store that refuses are
reported once per bundle and manifest (journal and status) and looked at again after
``recheck_s`` (keys or space may change). Every table kept per bundle, digest or peer is
bounded (``standing.Lru``). Ports: ``PeerClientPort``
(``adapters.http.client``), ``FetchStorePort`` (``adapters.store.fetched``); the import is
the importer's ``import_stored``, handed in by the daemon.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

import structlog

from nodeagent.bundles import ecdsa_signature, minisign
from nodeagent.bundles.manifest import MAX_MANIFEST_BYTES
from nodeagent.errors import (
    BundleFetchFailed,
    BundleManifestInvalid,
    NodeAgentError,
    PeerAnswerInvalid,
    PeerBusy,
    PeerUnreachable,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
)
from nodeagent.progress import ProgressMeter
from nodeagent.site.asking import AskedViews
from nodeagent.site.discovery import PeerView
from nodeagent.site.fetching import FetchSchedule, SignedBundle
from nodeagent.site.follow import FollowDecision, decide
from nodeagent.site.imports import MAX_MEMO, FetchedImports, source
from nodeagent.site.offers import Offer, offers
from nodeagent.site.release_files import fetch_release_files
from nodeagent.site.standing import Lru, PeerStandings
from nodeagent.site.transfer import MESSAGE_CHARS, FetcherPorts, FetchRun
from nodeagent.status import BundleReport
from nodeagent.strict import clip
from nodeagent.units import format_bytes

log = structlog.get_logger(__name__)

SIGNATURE_NAME: Final = "bundle.json.minisig"
ECDSA_SIGNATURE_NAME: Final = "bundle.json.ecdsa-sig"
MANIFEST_NAME: Final = "bundle.json"
MAX_DIGESTS: Final = 4096
"""Manifest digests remembered as verified, bad, or failed from given peers."""
MANIFEST_FAULTS: Final = (SignatureInvalid, SignatureMalformed, SignatureMissing, PeerAnswerInvalid)
"""What a peer's ``bundle.json`` and signature can get wrong: that pair failed, from that
peer (the manifest digest itself may still be right: a liar may pair the honest manifest
with a broken signature)."""


@dataclass(slots=True)
class _Memo:
    """Per (bundle id, manifest digest): when to look again, and the failure count."""

    until_s: float
    failures: int = 0


class BundleFetcher:
    """Looks at the peers' offers and fetches what this node follows, one bundle at a time."""

    def __init__(
        self, ports: FetcherPorts, *, concurrency: int, rng: random.Random | None = None
    ) -> None:
        self.ports = ports
        self.concurrency = concurrency
        self.rng = rng or random.Random()  # noqa: S311  (tie-breaks, not secrecy)
        self.standings = PeerStandings()
        """What this node measured of each peer, kept across bundles (bounded)."""
        self._memo: Lru[tuple[str, str], _Memo] = Lru(MAX_MEMO)
        self._resumed = False
        self.imports = FetchedImports(ports, self._backoff_s)
        self._verified: Lru[str, bool] = Lru(MAX_DIGESTS)
        """Manifest digests whose signature checked out here before: tried first."""
        self._bad: Lru[str, str] = Lru(MAX_DIGESTS)
        """Manifest digests whose signed content is invalid: never tried again."""
        self._failed_from: Lru[str, frozenset[str]] = Lru(MAX_DIGESTS)
        """Manifest digest → peers that sent a pair failing for it: not asked again for it."""
        self.asked = AskedViews(ports.client, ports.own_node)
        """The static peers' holdings, each peer asked on its own."""

    async def close(self) -> None:
        """Cancel the holdings requests still under way."""
        await self.asked.close()

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
            await self.imports.resume()
            self._resumed = True
        await self.imports.retry_due()
        held = await asyncio.to_thread(store.held)
        for offer in self._offers(await self._views(peers)):
            key = (offer.bundle_id, offer.manifest_digest)
            if held.get(offer.bundle_id) == (offer.manifest_digest, True):
                continue
            if not self._is_due(key) or not self._still_offered(offer):
                continue
            # an unfinished fetch of this very manifest is not "held": it is resumed
            facts_held = {i: d for i, (d, _) in held.items() if (i, d) != key}
            await self._consider(offer, facts_held, _others(peers, offer.holders))
            held = await asyncio.to_thread(store.held)

    def _is_due(self, key: tuple[str, str]) -> bool:
        memo = self._memo.get(key)
        return memo is None or self.ports.clock() >= memo.until_s

    def _still_offered(self, offer: Offer) -> bool:
        """Whether a holder not demoted (nor failed for it) is left: a peer demoted during
        this look gets none of its other offers looked at (a liar listing 4096 invented
        digests costs one manifest, not 4096)."""
        now_s = self.ports.clock()
        failed = self._failed_from.get(offer.manifest_digest) or frozenset()
        return offer.manifest_digest not in self._bad and any(
            a not in failed and not self.standings.is_demoted(a, now_s) for a in offer.holders
        )

    def _offers(self, views: dict[str, list[tuple[str, str]]]) -> list[Offer]:
        now_s = self.ports.clock()

        def failed_from(digest: str) -> frozenset[str]:
            return self._failed_from.get(digest) or frozenset()

        return offers(
            views,
            rng=self.rng,
            bad=self._bad,
            verified=self._verified,
            failed_from=failed_from,
            is_demoted=lambda address: self.standings.is_demoted(address, now_s),
        )

    async def _views(self, peers: Sequence[PeerView]) -> dict[str, list[tuple[str, str]]]:
        """What each peer holds: published, else asked (``asking.AskedViews``)."""
        views = {
            view.address: [(b.bundle_id, b.manifest_digest) for b in view.bundles]
            for view in peers
            if view.bundles is not None
        }
        asked = [view.address for view in peers if view.bundles is None]
        return views | await self.asked.views(asked) if asked else views

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
        decision = decide(
            signed.manifest, signed.manifest_digest, facts, signed.key_id_hex, signed.linked
        )
        if not decision.is_following:
            self._skip(key, decision)
            return
        await self._attempt(signed, offer.holders, others)

    async def _signed(self, offer: Offer) -> SignedBundle | None:
        """The manifest and signature from the first holder that sends a pair that verifies
        as the digest offered; None (reported) when none does. A holder whose pair fails
        is not asked for that digest again and is demoted; one that fails or is too slow
        is demoted."""
        key = (offer.bundle_id, offer.manifest_digest)
        last: NodeAgentError | None = None
        for address in offer.holders:
            try:
                signed = await self._signed_from(address, offer.bundle_id)
                if signed.manifest_digest != offer.manifest_digest:
                    raise PeerAnswerInvalid(
                        f"peer {address} sent another bundle.json than it offers"
                    )
            except NodeAgentError as err:
                last = err
                self._blame(address, offer, err)
                continue
            self._verified[signed.manifest_digest] = True
            return signed
        if last is not None:
            self._refused(key, offer.bundle_id, last, event="bundle_fetch_refused")
        return None

    def _blame(self, address: str, offer: Offer, err: NodeAgentError) -> None:
        """What a holder's failed manifest says about it, and about the digest."""
        digest = offer.manifest_digest
        if isinstance(err, BundleManifestInvalid):  # signed, and invalid: the digest is bad
            self._bad[digest] = err.reason
            return
        if isinstance(err, MANIFEST_FAULTS):
            failed = self._failed_from.get(digest) or frozenset()
            self._failed_from[digest] = failed | {address}
        elif not isinstance(err, PeerUnreachable) or isinstance(err, PeerBusy):
            return  # not the peer's doing (a key this node lacks), or only busy
        seconds = self.standings.failed(address, self.ports.clock())
        log.warning(
            "peer_demoted",
            peer=address,
            bundle=clip(offer.bundle_id, 128),
            manifest=digest,
            reason=err.reason,
            error=clip(err.message, MESSAGE_CHARS),
            demoted_s=round(seconds),
        )

    async def _signed_from(self, address: str, bundle_id: str) -> SignedBundle:
        client = self.ports.client
        data = await client.bundle_file(address, bundle_id, MANIFEST_NAME, MAX_MANIFEST_BYTES)
        signature = await client.signature_file(
            address, bundle_id, SIGNATURE_NAME, minisign.MAX_SIGNATURE_BYTES
        )
        ecdsa = await client.signature_file(
            address, bundle_id, ECDSA_SIGNATURE_NAME, ecdsa_signature.MAX_SIGNATURE_BYTES
        )
        signed = await asyncio.to_thread(self.ports.store.verify, data, signature, ecdsa)
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
        wait_s = self._backoff_s(failures)
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
                source(bundle_id),
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
        self._memo.pop(key)
        self.imports.set_pending(manifest.bundle_id, signed.manifest_digest)
        await self.imports.run(signed)

    def _backoff_s(self, failures: int) -> float:
        first, most = self.ports.timings.retry_after_s
        return float(min(most, first * 2 ** (failures - 1)))

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
            source(manifest.bundle_id),
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
        schedule = FetchSchedule.start(
            missing, peers, concurrency=self.concurrency, standings=self.standings
        )
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
