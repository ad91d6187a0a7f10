"""Pinned images the runtime lost (wiped or repaired away after a power cut, removed by
hand): told apart, reported once, restored from the local store before any registry.

The Reconciler runs with the real pin, pull and admission services over in-memory ports
(``tests/service/test_reconciler.Node``); the local store is an in-memory
``ImageRestorer`` that stores what it restores in the fake runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from structlog.testing import capture_logs

from nodeagent.errors import RegistryUnavailable
from nodeagent.ports import PullTerms
from nodeagent.prepull import PullResult
from nodeagent.sync.losses import LOST, WIPED, find_loss
from tests.service.test_reconciler import A, B, C, Node, by_name, image_set


class MemoryRestorer:
    """Holds some images; restoring one stores it in the runtime (as a pull from the
    store's loopback mirror would)."""

    def __init__(self, node: Node, *held: str, failing: Sequence[str] = ()) -> None:
        self.node = node
        self.held = set(held)
        self.failing = set(failing)
        self.calls: list[list[str]] = []

    async def holds(self, refs: Sequence[str]) -> list[str]:
        return [ref for ref in refs if ref in self.held]

    async def restore(self, refs: Sequence[str]) -> Mapping[str, PullResult]:
        self.calls.append(list(refs))
        results = {}
        for ref in refs:
            if ref in self.failing:
                results[ref] = PullResult(ref, False, 1, 0.1, "StoreBlobCorrupt", "bad blob")
                continue
            self.node.crio.store(ref)
            results[ref] = PullResult(ref, True, 1, 0.1)
        return results


def test_a_loss_is_classified_by_what_is_left() -> None:
    assert find_loss({A, B}, {A.lower(), B.lower()}, 2, "t") is None
    some = find_loss({A, B}, {A.lower()}, 1, "t")
    assert some is not None and (some.reason, some.lost) == (LOST, (B,))
    wiped = find_loss({A, B}, set(), 0, "t")
    assert wiped is not None and (wiped.reason, wiped.lost) == (WIPED, (A, B))
    # every pinned image gone while the runtime holds others (the kubelet pulled its pause
    # image first): lost, not wiped, with every image named
    others = find_loss({A, B}, {"registry.k8s.io/pause:3.10"}, 1, "t")
    assert others is not None and (others.reason, len(others.lost)) == (LOST, 2)
    assert "2 of 2 pinned images" in others.message


async def test_a_wiped_runtime_is_reported_once_and_its_images_pulled_again() -> None:
    node = Node(image_set("apps", A, B))
    await node.reconciler.sync()
    node.crio.images.clear()  # CRI-O wiped its store at boot
    node.crio.pull_calls.clear()

    with capture_logs() as logs:
        status = await node.reconciler.sync()
        again = await node.reconciler.sync()

    lost = [e for e in logs if e["event"] == "pinned_images_lost"]
    assert len(lost) == 1
    assert (lost[0]["reason"], lost[0]["images"], lost[0]["pinned"]) == (WIPED, 2, 2)
    assert sorted(node.crio.pull_calls) == [A, B]  # no store: from the registry
    assert status.image_loss is not None
    assert status.image_loss["reason"] == WIPED
    assert status.image_loss["restoredFromStore"] == 0
    assert by_name(status)["apps"].state == "Pinned"
    assert again.image_loss is not None and again.image_loss["resolved"] is True
    assert node.crio.pinned_names() == {A: True, B: True}


async def test_lost_images_come_back_from_the_store_first_and_the_rest_from_the_registry() -> None:
    node = Node(image_set("apps", A, B, C))
    await node.reconciler.sync()
    restorer = MemoryRestorer(node, A, B)
    node.reconciler.restorer = restorer
    await node.crio.remove_image(B)  # A stays; B and C were repaired away
    await node.crio.remove_image(C)
    node.crio.pull_calls.clear()

    with capture_logs() as logs:
        status = await node.reconciler.sync()

    assert restorer.calls == [[B]]
    assert node.crio.pull_calls == [C]  # only what the store lacks goes to the registry
    restored = next(e for e in logs if e["event"] == "images_restored_from_store")
    assert restored["images"] == 1
    assert restored["message"] == "restored 1 images from the local store"
    assert status.image_loss is not None
    assert status.image_loss["reason"] == LOST
    assert status.image_loss["restoredFromStore"] == 1
    assert by_name(status)["apps"].state == "Pinned"


async def test_an_image_the_store_fails_to_restore_falls_back_to_its_registry() -> None:
    node = Node(image_set("apps", A))
    await node.reconciler.sync()
    node.reconciler.restorer = MemoryRestorer(node, A, failing=[A])
    node.crio.images.clear()
    node.crio.pull_calls.clear()

    with capture_logs() as logs:
        status = await node.reconciler.sync()

    failed = next(e for e in logs if e["event"] == "restore_failed")
    assert (failed["image"], failed["reason"]) == (A, "StoreBlobCorrupt")
    assert node.crio.pull_calls == [A]
    assert by_name(status)["apps"].state == "Pinned"


async def test_nothing_missing_asks_the_store_nothing() -> None:
    node = Node(image_set("apps", A))
    restorer = MemoryRestorer(node)
    node.reconciler.restorer = restorer
    await node.reconciler.sync()  # A is new, not lost: the store does not hold it
    await node.reconciler.sync()
    assert restorer.calls == []


async def test_a_lost_image_stays_pinned_while_neither_store_nor_registry_brings_it_back() -> None:
    """Pins stay in place throughout: the drop-in keeps the lost image, so it is pinned the
    moment it is back, and the loss is not taken for resolved."""
    node = Node(image_set("apps", A, B), failing={B: RegistryUnavailable("no registry")})
    node.crio.store(B)  # B came from a bundle: the registry never had to answer for it
    await node.reconciler.sync()
    node.reconciler.restorer = MemoryRestorer(node, B, failing=[B])
    await node.crio.remove_image(B)

    with capture_logs() as logs:
        status = await node.reconciler.sync()
        again = await node.reconciler.sync()

    assert not [e for e in logs if e["event"] == "image_unpinned"]
    assert B in node.crio.patterns
    assert by_name(status)["apps"].state != "Pinned"
    assert again.image_loss is not None and again.image_loss["resolved"] is False
    node.crio.store(B)  # back by any means: pinned at once, by the pins already in place
    assert node.crio.pinned_names()[B] is True


async def test_a_not_ready_node_restores_from_the_store_and_holds_only_registry_pulls() -> None:
    """After a power cut the Node is often NotReady because its images are gone: the store
    brings back what it holds, registry pulls wait with the Node's reason, then run."""
    node = Node(image_set("apps", A, B, C))
    await node.reconciler.sync()
    restorer = MemoryRestorer(node, A, B)
    node.reconciler.restorer = restorer
    node.reconciler.pull_terms = lambda: PullTerms("NodeNotReady", "the Node n1 is not Ready")
    node.crio.images.clear()
    node.crio.pull_calls.clear()

    with capture_logs() as logs:
        status = await node.reconciler.sync()

    assert restorer.calls == [[A, B]]
    assert node.crio.pull_calls == []
    [failure] = by_name(status)["apps"].failures
    assert (failure.ref, failure.reason) == (C, "NodeNotReady")
    assert any(e["event"] == "registry_pulls_waiting" for e in logs)

    node.reconciler.pull_terms = PullTerms  # the kubelet reports the Node Ready again
    status = await node.reconciler.sync()
    assert node.crio.pull_calls == [C]
    assert by_name(status)["apps"].state == "Pinned"


def test_the_loss_s_message_follows_the_images_back() -> None:
    """The status keeps the loss after the images are back: its message must not still say
    they are being brought back (found in make demo's status after a power cut)."""
    loss = find_loss([A, B], present=[], runtime_images=0, at="t")
    assert loss is not None
    assert loss.message.endswith("they stay pinned and are being brought back")
    partly = replace(loss, restored_from_store=1)
    assert partly.message.endswith("they stay pinned and are being brought back")
    restored = replace(loss, restored_from_store=2)
    assert restored.message.endswith(
        "they stayed pinned and were brought back from the local store"
    )
    pulled_again = replace(loss, is_resolved=True)
    assert pulled_again.message.endswith("they stayed pinned and were brought back")
    assert pulled_again.to_json()["message"] == pulled_again.message
