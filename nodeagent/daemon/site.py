"""The peer server as a daemon task (``[site] serve = true``; docs/site.md).

Loaded only when serving is on: it imports aiohttp (about 9 MiB, docs/decisions/0027).
The task is optional: if it fails (a certificate that does not load, a port in use), the
supervisor restarts it with backoff and pinning goes on.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from pathlib import Path

from nodeagent.adapters.http.peer import PeerServer, peer_caps
from nodeagent.adapters.http.tls import ReloadingTls
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.keeper import set_aside_corrupt
from nodeagent.config import Config
from nodeagent.config.addresses import parse_address
from nodeagent.errors import StoreBlobCorrupt
from nodeagent.metrics import NO_METRICS, Metrics
from nodeagent.metrics.series import Transfer


def node_name(config: Config) -> str:
    """The name peers see in ``holdings``: the Node's (as cluster mode names it)."""
    return config.cluster.node_name or socket.gethostname().split(".")[0].lower()


SERVED_COUNT_INTERVAL_S = 15.0
"""How often the bytes served to peers are added to the metrics (only when they are on)."""


async def serve_peers(config: Config, metrics: Metrics = NO_METRICS) -> None:
    """Serve the store to the site's peers until cancelled."""
    site = config.site
    address = parse_address(site.listen)  # checked when the configuration was loaded
    await asyncio.to_thread(BlobStore(config.store_dir).ensure)
    tls = await asyncio.to_thread(ReloadingTls, site.cert_file, site.key_file, site.ca_file)
    server = PeerServer(
        config.store_dir,
        tls,
        node=node_name(config),
        host=address.host,
        port=address.port,
        max_uploads=site.max_uploads,
        upload_max_bytes=site.upload_max_bytes,
        request_timeout_s=site.request_timeout_s,
        caps=peer_caps(site),
        handshake_timeout_s=site.handshake_timeout_s,
        on_corrupt=functools.partial(_set_aside, config.store_dir, metrics),
    )
    async with server:
        if metrics is NO_METRICS:
            await asyncio.Event().wait()  # until cancelled (the daemon stops)
        counted = 0
        try:
            while True:
                await asyncio.sleep(SERVED_COUNT_INTERVAL_S)
                counted = _count_served(server, metrics, counted)
        finally:
            _count_served(server, metrics, counted)


def _count_served(server: PeerServer, metrics: Metrics, counted: int) -> int:
    served = server.counters.bytes_served
    metrics.transferred(Transfer.SERVED, served - counted)
    return served


def _set_aside(root: Path, metrics: Metrics, digest: str) -> bool:
    """A blob a peer asked for failed its digest: set aside, and counted."""
    is_corrupt = set_aside_corrupt(root, digest)
    if is_corrupt:
        metrics.store_damaged(StoreBlobCorrupt.reason)
    return is_corrupt
