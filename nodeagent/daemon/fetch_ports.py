"""The fetcher's ports, loaded when first needed (the idle budget, decision 0069).

A follower looks at its peers every few seconds. In cluster mode their holdings come from
the API, so with nothing to fetch it makes no request and, with an empty store, reads
nothing: ``LazyPeerClient`` loads aiohttp (12 MiB resident) at the first request to a peer,
and ``LazyFetchStore`` loads the store's fetch code (manifests, signatures, the blob store:
3.2 MiB) once the store holds a bundle or a rollback mark, or a fetch begins. What an empty
store answers without that code is what the loaded code would answer: no bundle held,
none unfinished, no signed manifest and no mark.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from nodeagent.config import Config
from nodeagent.store import layout

if TYPE_CHECKING:
    from nodeagent.adapters.http.client import PeerClient
    from nodeagent.adapters.http.tls import ReloadingClientTls
    from nodeagent.adapters.store.fetched import FetchStore
    from nodeagent.bundles.freshness import Stamp
    from nodeagent.bundles.manifest import BundleManifest
    from nodeagent.site.fetching import SignedBundle
    from nodeagent.site.holdings import Have, Holdings
    from nodeagent.site.transfer import Download


class LazyPeerClient:
    """``site.transfer.PeerClientPort`` over a ``PeerClient`` made at the first request."""

    def __init__(self, config: Config, tls: ReloadingClientTls) -> None:
        self.config = config
        self.tls = tls
        self._client: PeerClient | None = None

    def _get(self) -> PeerClient:
        if self._client is None:
            from nodeagent.adapters.http.client import (  # noqa: PLC0415  (aiohttp)
                PeerClient,
                RequestBounds,
            )

            site = self.config.site
            bounds = RequestBounds(min_rate_bytes_s=site.fetch_min_rate_bytes)
            self._client = PeerClient(
                self.tls, request_timeout_s=site.request_timeout_s, bounds=bounds
            )
        return self._client

    async def holdings(self, address: str) -> Holdings:
        return await self._get().holdings(address)

    async def have(self, address: str, bundle_id: str) -> Have:
        return await self._get().have(address, bundle_id)

    async def bundle_file(self, address: str, bundle_id: str, name: str, max_bytes: int) -> bytes:
        return await self._get().bundle_file(address, bundle_id, name, max_bytes)

    async def signature_file(
        self, address: str, bundle_id: str, name: str, max_bytes: int
    ) -> bytes | None:
        return await self._get().signature_file(address, bundle_id, name, max_bytes)

    async def blob(
        self,
        address: str,
        digest: str,
        *,
        offset: int,
        size_bytes: int,
        write: Callable[[bytes], Awaitable[None]],
    ) -> int:
        return await self._get().blob(
            address, digest, offset=offset, size_bytes=size_bytes, write=write
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


class LazyFetchStore:
    """``site.transfer.FetchStorePort`` over a ``FetchStore`` made once it is needed."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._store: FetchStore | None = None

    def _get(self) -> FetchStore:
        if self._store is None:
            from nodeagent.adapters.store.fetched import FetchStore  # noqa: PLC0415
            from nodeagent.daemon.bundles import node_store  # noqa: PLC0415

            config = self.config
            self._store = FetchStore(
                config.store_dir,
                config.bundles.trusted_keys_dir,
                node_store(config).limits,
                fills=config.site.fetch_concurrency,
                fips_switch=config.bundles.fips_switch,
            )
        return self._store

    def _is_empty(self) -> bool:
        """No bundle directory and no rollback mark yet (the code is not needed to say so);
        anything unreadable is left to the store's code, which says why."""
        if self._store is not None:
            return False
        root = self.config.store_dir
        try:
            if (root / layout.ROLLBACK_MARKS_NAME).exists():
                return False
            return next((root / layout.BUNDLES_DIR).iterdir(), None) is None
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def verify(
        self, data: bytes, signature: bytes | None, ecdsa: bytes | None = None
    ) -> SignedBundle:
        return self._get().verify(data, signature, ecdsa)

    def held(self) -> dict[str, tuple[str, bool]]:
        return {} if self._is_empty() else self._get().held()

    def unfinished(self) -> list[SignedBundle]:
        return [] if self._is_empty() else self._get().unfinished()

    def accepted(self) -> tuple[Stamp, ...]:
        return () if self._is_empty() else self._get().accepted()

    def stored_signed(self, bundle_id: str) -> SignedBundle | None:
        return None if self._is_empty() else self._get().stored_signed(bundle_id)

    def missing(self, manifest: BundleManifest) -> dict[str, int]:
        return self._get().missing(manifest)

    def begin(self, signed: SignedBundle) -> int:
        return self._get().begin(signed)

    async def fill(
        self,
        digest: str,
        size_bytes: int,
        download: Download,
        on_bytes: Callable[[int], None] = lambda _n: None,
    ) -> None:
        await self._get().fill(digest, size_bytes, download, on_bytes)

    def finish(
        self, signed: SignedBundle, extra: Mapping[str, bytes] = MappingProxyType({})
    ) -> None:
        self._get().finish(signed, extra)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
