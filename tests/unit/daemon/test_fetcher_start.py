"""The follower loads its fetch code only once a peer may have something to give
(``daemon.root._until_offered``, decision 0069): at once with static peers or a store that
holds something; in cluster mode otherwise when a discovered peer publishes a bundle."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, cast

from nodeagent.cluster.holdings import HeldBundle
from nodeagent.config import Config
from nodeagent.daemon.root import _until_offered
from nodeagent.daemon.wiring import Wiring
from nodeagent.site.discovery import PeerView

HELD = HeldBundle("line-3", "sha256:" + "a" * 64, is_complete=True, blobs=3, size_bytes=300)


class Directory:
    """``site.discovery.PeerDirectory`` whose view the test sets."""

    def __init__(self) -> None:
        self.view: tuple[PeerView, ...] = (PeerView("10.0.0.2:9447", "edge-2", ()),)
        self.version = 0
        self._changed = asyncio.Condition()

    def peers(self) -> tuple[PeerView, ...]:
        return self.view

    async def set(self, view: tuple[PeerView, ...]) -> None:
        async with self._changed:
            self.view, self.version = view, self.version + 1
            self._changed.notify_all()

    async def changed(self, since: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self.version != since)
            return self.version


def wiring(tmp_path: Path, directory: Directory | None, peers: tuple[str, ...] = ()) -> Wiring:
    config = Config.default(root=tmp_path)
    site = dataclasses.replace(config.site, peers=peers)
    config = dataclasses.replace(config, site=site)
    cluster: Any = None if directory is None else type("C", (), {"peers": directory})()
    return cast(Wiring, type("W", (), {"config": config, "cluster": cluster})())


async def test_a_discovered_peer_publishing_a_bundle_starts_the_fetch_code(
    tmp_path: Path,
) -> None:
    directory = Directory()
    waiting = asyncio.create_task(_until_offered(wiring(tmp_path, directory)))
    await directory.set((PeerView("10.0.0.2:9447", "edge-2", ()),))  # still nothing held
    await asyncio.sleep(0)
    assert not waiting.done()
    await directory.set((PeerView("10.0.0.2:9447", "edge-2", (HELD,)),))
    await asyncio.wait_for(waiting, timeout=5)


async def test_static_peers_a_held_store_or_no_cluster_start_at_once(tmp_path: Path) -> None:
    await asyncio.wait_for(_until_offered(wiring(tmp_path, None)), timeout=5)
    statics = wiring(tmp_path, Directory(), peers=("10.0.0.9:9447",))
    await asyncio.wait_for(_until_offered(statics), timeout=5)
    held = wiring(tmp_path, Directory())
    (held.config.store_dir / "bundles" / "line-3").mkdir(parents=True)
    await asyncio.wait_for(_until_offered(held), timeout=5)
    unknown = Directory()
    unknown.view = (PeerView("10.0.0.3:9447", "", None),)  # holdings unknown: ask
    await asyncio.wait_for(_until_offered(wiring(tmp_path / "x", unknown)), timeout=5)
