"""The peer server as a daemon task (``[site] serve = true``; docs/site.md).

Loaded only when serving is on: it imports aiohttp (about 9 MiB, docs/decisions/0027).
The task is optional: if it fails (a certificate that does not load, a port in use), the
supervisor restarts it with backoff and pinning goes on.
"""

from __future__ import annotations

import asyncio
import functools
import socket

from nodeagent.adapters.http.peer import PeerServer
from nodeagent.adapters.http.tls import ReloadingTls
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.keeper import set_aside_corrupt
from nodeagent.config import Config
from nodeagent.config.addresses import parse_address


def node_name(config: Config) -> str:
    """The name peers see in ``holdings``: the Node's (as cluster mode names it)."""
    return config.cluster.node_name or socket.gethostname().split(".")[0].lower()


async def serve_peers(config: Config) -> None:
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
        on_corrupt=functools.partial(set_aside_corrupt, config.store_dir),
    )
    async with server:
        await asyncio.Event().wait()  # until cancelled (the daemon stops)
