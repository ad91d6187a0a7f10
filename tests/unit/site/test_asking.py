"""The static peers' holdings, each peer asked on its own (``nodeagent.site.asking``)."""

from __future__ import annotations

import asyncio

from nodeagent.errors import PeerUnreachable
from nodeagent.site.asking import AskedViews
from nodeagent.site.holdings import BundleHolding, Have, Holdings

DIGEST = f"sha256:{'a' * 64}"


class Peers:
    """A client whose peers answer at once, never (``slow``), or fail (``down``)."""

    def __init__(self) -> None:
        self.slow: set[str] = set()
        self.down: set[str] = set()
        self.asked: list[str] = []
        self.release = asyncio.Event()

    async def holdings(self, address: str) -> Holdings:
        self.asked.append(address)
        if address in self.slow:
            await self.release.wait()
        if address in self.down:
            raise PeerUnreachable(f"peer {address} failed")
        held = BundleHolding(f"b-{address[-1]}", DIGEST, 1, 1, 1, 1)
        return Holdings(f"node-{address[-1]}", 0, 3, (held,))

    async def have(self, address: str, bundle_id: str) -> Have:
        raise NotImplementedError

    async def signature_file(
        self, address: str, bundle_id: str, name: str, max_bytes: int
    ) -> bytes | None:
        raise AssertionError("not asked")

    async def bundle_file(self, address: str, bundle_id: str, name: str, max_bytes: int) -> bytes:
        raise NotImplementedError

    async def blob(self, address: str, digest: str, **_kw: object) -> int:
        raise NotImplementedError


async def test_a_slow_peer_delays_a_look_by_the_wait_at_most_and_is_asked_once() -> None:
    peers = Peers()
    peers.slow.add("p2")
    views = AskedViews(peers, own_node="", wait_s=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    found = await views.views(["p1", "p2", "p3"])
    assert loop.time() - started < 1.0
    assert set(found) == {"p1", "p3"}
    await views.views(["p1", "p2", "p3"])
    assert peers.asked.count("p2") == 1  # its request is still under way: not asked twice
    peers.release.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert set(await views.views(["p1", "p2", "p3"])) == {"p1", "p2", "p3"}
    await views.close()


async def test_a_peer_that_fails_or_is_this_node_is_left_out() -> None:
    peers = Peers()
    views = AskedViews(peers, own_node="node-2", wait_s=0.2)
    assert set(await views.views(["p1", "p2"])) == {"p1"}  # p2 names this node
    peers.down.add("p1")
    assert await views.views(["p1", "p2"]) == {}  # p1's last answer forgotten
    await views.close()
    assert views.under_way == 0
