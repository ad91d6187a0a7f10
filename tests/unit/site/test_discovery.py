"""Discovery's pure rules: what a node publishes, its address, the merged peer view."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nodeagent.cluster.holdings import HeldBundle, Holdings, holdings_of
from nodeagent.config import ClusterSettings, Config
from nodeagent.config.settings import SiteSettings
from nodeagent.site.discovery import (
    PeerView,
    StaticPeers,
    bundle_steps,
    held_bundles,
    merge_peers,
    node_address,
    poll_interval_s,
    shared_addresses,
)
from nodeagent.site.roles import is_following, is_publishing
from nodeagent.status import BundleReport, NodeStatus
from nodeagent.store.layout import BlobRef, BundleRecord, registry_record

D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
B1, B2 = BlobRef("sha256:" + "a" * 64, 100), BlobRef("sha256:" + "b" * 64, 200)


def record(bundle_id: str, blobs: tuple[BlobRef, ...] = (B1, B2)) -> BundleRecord:
    return BundleRecord(bundle_id, "ABCD", "k", "default", "2026-11-22", 1.0, (), (), blobs)


def test_a_record_whose_blobs_are_all_stored_is_complete() -> None:
    stored = {B1.digest: 100, B2.digest: 200}
    (held,) = held_bundles([record("a")], stored, {"a": D1})
    assert held == HeldBundle("a", D1, True, 2, 300)


@pytest.mark.parametrize("stored", [{}, {B1.digest: 100}, {B1.digest: 100, B2.digest: 199}])
def test_a_blob_missing_or_of_another_size_makes_it_incomplete(stored: dict[str, int]) -> None:
    (held,) = held_bundles([record("a")], stored, {"a": D1})
    assert not held.is_complete
    assert (held.blobs, held.size_bytes) == (2, 300)  # the manifest's totals, not what is held


def test_started_bundles_are_listed_and_a_record_of_the_same_id_wins() -> None:
    started = [HeldBundle("b", D2, False, 5, 50), HeldBundle("a", D2, False, 9, 90)]
    held = held_bundles([record("a")], {B1.digest: 100, B2.digest: 200}, {"a": D1}, started)
    assert held == (HeldBundle("a", D1, True, 2, 300), HeldBundle("b", D2, False, 5, 50))


def test_registry_sets_and_records_without_a_readable_manifest_are_not_published() -> None:
    reg = registry_record("apps", (), (B1,), "now", 1.0)
    assert held_bundles([reg, record("a")], {B1.digest: 100}, {"apps": D1}) == ()


def node(*addresses: tuple[str, str]) -> dict[str, Any]:
    return {"status": {"addresses": [{"type": t, "address": a} for t, a in addresses]}}


@pytest.mark.parametrize(
    ("obj", "advertise", "expected"),
    [
        (node(("Hostname", "w1"), ("InternalIP", "10.0.0.5")), "", "10.0.0.5:9447"),
        (node(("InternalIP", "fd00::5")), "", "[fd00::5]:9447"),
        (node(("InternalIP", "not-an-ip"), ("InternalIP", "10.0.0.6")), "", "10.0.0.6:9447"),
        (node(("ExternalIP", "1.2.3.4")), "", ""),
        (None, "", ""),
        ({"status": {"addresses": "x"}}, "", ""),
        (node(("InternalIP", "10.0.0.5")), "peer.example:443", "peer.example:443"),
    ],
)
def test_the_address_peers_use(obj: dict[str, Any] | None, advertise: str, expected: str) -> None:
    assert node_address(obj, listen="0.0.0.0:9447", advertise=advertise) == expected


def test_progress_does_not_change_the_bundle_steps() -> None:
    def status(state: str, done: int) -> NodeStatus:
        report = BundleReport("/media", state, "a", progress={"doneBytes": done})  # type: ignore[arg-type]
        return NodeStatus(sets=(), conditions=(), bundles=(report,))

    assert bundle_steps(status("storing", 1)) == bundle_steps(status("storing", 2))
    assert bundle_steps(status("storing", 2)) != bundle_steps(status("stored", 2))


def config(**site: Any) -> Config:
    base = Config.default(Path("/nonexistent"))
    return dataclasses.replace(
        base,
        cluster=ClusterSettings(enabled=site.pop("cluster", True)),
        site=SiteSettings(**site),
    )


@pytest.mark.parametrize(
    ("settings", "follows", "publishes"),
    [
        ({}, True, True),
        ({"follow": "off"}, False, False),
        ({"follow": "off", "serve": True}, False, True),
        ({"cluster": False}, False, False),
        ({"cluster": False, "peers": ("10.0.0.1:9447",)}, True, False),
        ({"cluster": False, "follow": "on", "serve": True}, True, False),
    ],
)
def test_who_follows_and_publishes(
    settings: dict[str, Any], follows: bool, publishes: bool
) -> None:
    cfg = config(**settings)
    assert (is_following(cfg), is_publishing(cfg)) == (follows, publishes)


def holdings(name: str, address: str, *, serving: bool = True) -> Holdings:
    return holdings_of(name, [HeldBundle("a", D1, True, 1, 1)], is_serving=serving, address=address)


def test_peers_are_the_other_serving_nodes_then_the_static_addresses_they_do_not_publish() -> None:
    published = [
        holdings("w3", "10.0.0.3:9447"),
        holdings("me", "10.0.0.1:9447"),
        holdings("w2", "10.0.0.2:9447"),
        holdings("quiet", "10.0.0.9:9447", serving=False),
    ]
    static = ["10.0.0.2:9447", "10.0.0.1:9447", "10.0.0.7:9447", "10.0.0.7:9447"]
    view = merge_peers("me", published, static)
    assert [(p.node, p.address) for p in view] == [
        ("w2", "10.0.0.2:9447"),
        ("w3", "10.0.0.3:9447"),
        ("", "10.0.0.7:9447"),
    ]
    assert view[0].holds("a") == HeldBundle("a", D1, True, 1, 1)
    assert view[2].bundles is None  # unknown, never "holds nothing"
    assert view[2].holds("a") is None


def test_without_discovery_the_static_peers_alone() -> None:
    assert merge_peers("me", (), ["[FD00::1]:9447"]) == (PeerView("[fd00::1]:9447"),)


async def test_static_peers_alone_never_change() -> None:
    directory = StaticPeers(["10.0.0.7:9447", "10.0.0.7:9447", "peer.example:9447"])
    assert [p.address for p in directory.peers()] == ["10.0.0.7:9447", "peer.example:9447"]
    assert all(p.bundles is None for p in directory.peers())
    assert await directory.changed(5) == 0  # a stale version: answered at once
    waiting = asyncio.create_task(directory.changed(0))
    await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting


def test_poll_interval_grows_with_the_peers_that_must_be_asked() -> None:
    published = PeerView("10.0.0.9:9447", "node-9", ())
    asked = [PeerView(f"10.0.0.{i}:9447") for i in range(1, 8)]
    assert poll_interval_s([published]) == 10.0  # their changes wake the fetcher
    assert poll_interval_s([]) == 10.0
    assert poll_interval_s(asked[:1]) == 2.0  # the floor: 2.5 requests a second per server
    assert poll_interval_s([published, *asked]) == pytest.approx(2.8)  # 7 asked, 8 nodes
    many = [PeerView(f"10.0.{i // 250}.{i % 250}:9447") for i in range(256)]
    assert poll_interval_s(many) == 10.0  # the ceiling


def test_two_objects_claiming_one_address_are_neither_believed() -> None:
    """A node posing as another publishes its address with nothing (or other bundles) in
    its holdings: the honest node's bundles must not vanish under the liar's, nor the
    liar's be taken for the honest node's. The address is asked itself (its server's
    certificate names it), once."""
    published = [
        holdings("honest", "10.0.0.2:9447"),
        holdings_of("zz-liar", [], is_serving=True, address="10.0.0.2:9447"),
        holdings("w3", "10.0.0.3:9447"),
    ]
    view = merge_peers("me", published, ["10.0.0.2:9447"])
    assert [(p.node, p.address, p.bundles) for p in view] == [
        ("w3", "10.0.0.3:9447", view[0].bundles),
        ("", "10.0.0.2:9447", None),
    ]
    assert shared_addresses(published, "me") == {"10.0.0.2:9447": ["honest", "zz-liar"]}


def test_another_node_claiming_this_nodes_address_is_not_a_peer() -> None:
    published = [holdings("me", "10.0.0.1:9447"), holdings("poser", "10.0.0.1:9447")]
    assert merge_peers("me", published, []) == ()
