"""The peer watcher's view as snapshots arrive (``PeerWatcher.update``; its list+watch runs
against a real API server in tests/integration/cluster/test_discovery.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, NoReturn

from structlog.testing import capture_logs

from nodeagent.cluster.api import Obj
from nodeagent.cluster.holdings import HeldBundle, holdings_object, holdings_of
from nodeagent.cluster.kinds import ResourceKind
from nodeagent.cluster.objects import NodeIdentity
from nodeagent.cluster.tasks import Connection
from nodeagent.site.publishing import PeerWatcher

DIGEST = "sha256:" + "5" * 64


class NoApi:
    """``update`` never calls the API: every call fails the test."""

    server = "https://unused.invalid"

    async def is_served(self, kind: ResourceKind) -> bool:
        raise AssertionError("not used")

    def informer(
        self, kind: ResourceKind, *, field_selector: str | None = None
    ) -> AsyncIterator[dict[str, Obj]]:
        raise AssertionError("not used")

    async def apply(
        self, kind: ResourceKind, body: Obj, *, subresource: str | None = None
    ) -> NoReturn:
        raise AssertionError("not used")

    async def create(self, kind: ResourceKind, body: Obj) -> NoReturn:
        raise AssertionError("not used")


def obj(name: str, *bundle_ids: str, address: str = "") -> dict[str, Any]:
    held = [HeldBundle(b, DIGEST, True, 1, 10) for b in bundle_ids]
    address = address or f"10.0.0.{sum(map(ord, name)) % 250}:9447"  # one address a node
    return holdings_object(
        NodeIdentity(name, ""), holdings_of(name, held, is_serving=True, address=address)
    )


def watcher() -> PeerWatcher:
    api = NoApi()
    return PeerWatcher(api, Connection(api.server), node="me", static_peers=["10.9.9.9:9447"])


async def test_the_version_moves_only_when_the_view_changes_and_wakes_a_waiter() -> None:
    w = watcher()
    assert [(p.node, p.address) for p in w.peers()] == [("", "10.9.9.9:9447")]
    waiter = asyncio.create_task(w.changed(0))
    w.update({"me": obj("me", "a"), "w2": obj("w2", "a")})
    assert await asyncio.wait_for(waiter, 5) == 1
    w.update({"me": obj("me", "a", "b"), "w2": obj("w2", "a")})  # only its own changed
    assert w.version == 1
    w.update({"w2": obj("w2", "a", "b")})
    assert w.version == 2
    (peer, static) = w.peers()
    assert peer.node == "w2" and peer.holds("b") is not None
    assert static.address == "10.9.9.9:9447"


async def test_an_invalid_object_is_left_out_and_logged_once() -> None:
    w = watcher()
    bad = obj("w3", "a")
    bad["spec"]["bundles"][0]["manifestDigest"] = "\x1b[31mnot a digest"
    with capture_logs() as logs:
        for _ in range(3):
            w.update({"w2": obj("w2", "a"), "w3": bad})
    assert [p.node for p in w.peers()] == ["w2", ""]
    warnings = [e for e in logs if e["event"] == "peer_holdings_invalid"]
    assert len(warnings) == 1
    assert warnings[0]["node"] == "w3" and warnings[0]["reason"] == "PeerHoldingsInvalid"
    assert "\x1b" not in warnings[0]["error"]
    with capture_logs() as logs:
        w.update({"w2": obj("w2", "a")})
        w.update({"w2": obj("w2", "a"), "w3": bad})  # refused again after it was gone
    assert [e["event"] for e in logs].count("peer_holdings_invalid") == 1


async def test_an_address_two_objects_claim_is_said_once_and_asked_itself() -> None:
    w = watcher()
    twin = obj("w9", address=str(obj("w2")["spec"]["address"]))  # poses as w2, empty
    with capture_logs() as logs:
        for _ in range(3):
            w.update({"w2": obj("w2", "a"), "w9": twin})
    claimed = [e for e in logs if e["event"] == "peer_address_claimed_twice"]
    assert len(claimed) == 1, claimed
    (asked, static) = w.peers()
    assert asked.bundles is None and asked.node == ""  # its holdings asked over HTTPS
    assert static.address == "10.9.9.9:9447"
