"""What the static peers hold, asked over HTTPS, each peer on its own (docs/decisions/0053).

A peer without published holdings (a ``[site] peers`` entry no discovered node publishes)
is asked for ``/nodeagent/v1/holdings``. ``AskedViews.views`` starts one request per such
peer that has none under way, waits ``VIEW_WAIT_S`` at most for them, and returns what each
peer said last: a peer that is slow to answer (one that sends a byte now and then) delays
a look by that much at most, never the other peers, and its request goes on in the
background within the client's deadline. A peer that fails is forgotten until it answers
again; one whose holdings name this node (``own_node``) is this node under another address
and never a peer. Bounded: one entry and one request per peer address (``MAX_PEERS``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final

import structlog

from nodeagent.errors import NodeAgentError
from nodeagent.site.standing import MAX_PEERS, Lru
from nodeagent.site.transfer import PeerClientPort

log = structlog.get_logger("nodeagent.site.fetcher")

VIEW_WAIT_S: Final = 3.0
"""A look waits this long for the static peers' holdings; one that has not answered by
then is left out of this look (its answer is used by the next one)."""

Held = list[tuple[str, str]]
"""(bundle id, manifest digest) a peer holds."""


class AskedViews:
    """The static peers' holdings, asked side by side, each request its own task."""

    def __init__(self, client: PeerClientPort, own_node: str, wait_s: float = VIEW_WAIT_S):
        self.client = client
        self.own_node = own_node
        self.wait_s = wait_s
        self._said: Lru[str, Held] = Lru(MAX_PEERS)
        """Peer → what its last holdings said."""
        self._asking: dict[str, asyncio.Task[None]] = {}
        """Peer → its holdings request under way."""

    async def views(self, addresses: Sequence[str]) -> dict[str, Held]:
        """What each of ``addresses`` held when it last answered (those that did)."""
        for address in addresses[:MAX_PEERS]:
            if address not in self._asking:
                self._asking[address] = asyncio.create_task(self._ask(address))
        pending = [self._asking[a] for a in addresses if a in self._asking]
        if pending:
            await asyncio.wait(pending, timeout=self.wait_s)
        found = {}
        for address in addresses:
            held = self._said.get(address)
            if held:
                found[address] = held
        return found

    async def _ask(self, address: str) -> None:
        try:
            holdings = await self.client.holdings(address)
        except NodeAgentError as err:
            log.debug("peer_holdings_unavailable", peer=address, reason=err.reason, error=str(err))
            self._said.pop(address)
            return
        finally:
            self._asking.pop(address, None)
        if self.own_node and holdings.node == self.own_node:
            self._said.pop(address)  # this node itself, under an address it does not use
            return
        self._said[address] = [(b.bundle_id, b.manifest_digest) for b in holdings.bundles]

    @property
    def under_way(self) -> int:
        return len(self._asking)

    async def close(self) -> None:
        """Cancel the requests still under way."""
        tasks = list(self._asking.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
