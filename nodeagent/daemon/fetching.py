"""The fetcher as a daemon task (``[site] follow``; docs/site.md, "Fetch").

Loaded only when the node follows (``site.roles.is_following``). aiohttp and the store's
fetch code load when first needed (``fetch_ports``): a follower in cluster mode reads its
peers' holdings from the API, so one with an empty store and nothing to fetch loads neither
(15 MiB resident, decision 0069). The task is optional: a failure is restarted with backoff by the
supervisor, pinning goes on. It looks at the peers when the peer directory changes
(cluster mode: a peer's published holdings changed), when the node mirror lacked a digest
(decision 0061) and every ``discovery.poll_interval_s`` (jittered) otherwise: 10 s when
every peer publishes, 0.4 s per static peer (``[site] peers``, holdings asked over HTTPS;
2 to 10 s) when some must be asked. A fetched bundle is imported and pinned from the store
by the same importer a stick uses, one import at a time with the media
(``MediaImports.lock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Sequence
from typing import Final

import structlog

from nodeagent.adapters.http.tls import ReloadingClientTls
from nodeagent.config import Config
from nodeagent.config.addresses import parse_address
from nodeagent.daemon.fetch_ports import LazyFetchStore, LazyPeerClient
from nodeagent.daemon.wiring import Wiring
from nodeagent.metrics.series import Transfer
from nodeagent.registries import node_platform
from nodeagent.site.discovery import PeerDirectory, PeerView, StaticPeers, poll_interval_s
from nodeagent.site.fetcher import BundleFetcher
from nodeagent.site.fetching import SignedBundle
from nodeagent.site.follow import FollowSetting, NodeFacts
from nodeagent.site.transfer import FetcherPorts, FetchTimings
from nodeagent.status import BundleReport

log = structlog.get_logger("nodeagent.site.fetcher")


MIN_LOOK_GAP_S: Final = 1.0
"""Looks woken by the node mirror's misses are at least this far apart (a client asking
for digests nobody holds costs one look a second at most, as the poll of 2 static peers)."""


async def _next_look(
    directory: PeerDirectory, version: int, wanted: asyncio.Event, wait_s: float
) -> None:
    """Wait until the peer directory changes, the node mirror lacked a digest (``wanted``,
    decision 0061: what it asked for may be in a bundle a peer holds) or ``wait_s`` passed;
    a look woken by ``wanted`` comes ``MIN_LOOK_GAP_S`` after the last one at the soonest."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    changed = asyncio.ensure_future(directory.changed(version))
    woken = asyncio.ensure_future(wanted.wait())
    try:
        done, _ = await asyncio.wait(
            (changed, woken), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in (changed, woken):
            task.cancel()
        await asyncio.gather(changed, woken, return_exceptions=True)
    if woken in done and changed not in done:
        await asyncio.sleep(max(0.0, MIN_LOOK_GAP_S - (loop.time() - started)))
    wanted.clear()


def own_addresses(config: Config) -> set[str]:
    """This node's own peer addresses (never a peer of itself, also when the static list
    that every node shares names it)."""
    found = set()
    for text in (config.site.advertise, config.site.listen):
        with contextlib.suppress(ValueError):
            if text:
                found.add(str(parse_address(text)))
    return found


def other_peers(peers: Sequence[PeerView], own: set[str]) -> list[PeerView]:
    return [p for p in peers if p.address not in own]


async def follow_peers(wiring: Wiring) -> None:
    """Fetch the bundles this node follows from its peers, until cancelled."""
    config, site = wiring.config, wiring.config.site
    tls = await asyncio.to_thread(
        ReloadingClientTls, site.client_cert_file, site.client_key_file, site.ca_file
    )
    client = LazyPeerClient(config, tls)
    store = LazyFetchStore(config)
    cluster = wiring.cluster
    watcher = cluster.peers if cluster is not None else None
    directory: PeerDirectory = watcher if watcher is not None else StaticPeers(site.peers)
    architecture = node_platform(os.uname().machine).architecture
    follow: FollowSetting = site.follow  # type: ignore[assignment]  # checked at load

    def facts(held: dict[str, str]) -> NodeFacts:
        labels = cluster.specs.node_labels() if cluster is not None else None
        return NodeFacts(
            follow=follow,
            is_cluster_mode=config.cluster.enabled,
            has_peers=bool(site.peers),
            architecture=architecture,
            labels=labels,
            held=held,
        )

    async def import_bundle(signed: SignedBundle, source: str) -> BundleReport:
        media = wiring.media
        async with media.lock:
            report = await media.importer.import_stored(
                signed.manifest,
                signed_by=signed.signed_by,
                key_id_hex=signed.key_id_hex,
                digest=signed.manifest_digest,
                source=source,
                linked=signed.linked,
            )
        if report.state == "imported":
            wiring.reconciler.request_sync()
        return report

    ports = FetcherPorts(
        client,
        store,
        facts,
        import_bundle,
        report=wiring.reporter.bundle_report,
        received=lambda size: wiring.metrics.transferred(Transfer.FETCHED, size),
        state=wiring.state,
        # only a configured name: host names may repeat (cloned images, one test machine)
        own_node=config.cluster.node_name,
        # a straggler is moved only under the rate at which the client would cut it anyway
        timings=FetchTimings(straggler_below_bytes_s=site.fetch_min_rate_bytes),
    )
    fetcher = BundleFetcher(ports, concurrency=site.fetch_concurrency)
    own = own_addresses(config)
    log.info("bundle_follow_started", peers=len(directory.peers()), follow=site.follow)
    try:
        while True:
            version = directory.version
            peers = other_peers(directory.peers(), own)
            await fetcher.look(peers)
            spread = random.uniform(0.8, 1.2)  # noqa: S311  (spreading, not secrecy)
            await _next_look(
                directory, version, wiring.fetch_wanted, poll_interval_s(peers) * spread
            )
    finally:
        await fetcher.close()
        await client.close()
        store.close()
