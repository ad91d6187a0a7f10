"""``[store] registry_sets`` in the sync: what is fetched into the store, when, and what a
failure there leaves to the registry pull.

The Reconciler runs with the real pin, pull and admission services over in-memory ports
(``tests/service/test_reconciler.Node``); the store is ``MemoryRestorer`` (restoring stores
the image in the fake runtime) and ``MemoryRegistryStore`` (fetching makes the store hold
the images). ``tests/integration/adapters/store/test_registry_sets.py`` holds the real
adapter to the same promises; ``tests/integration/pins/test_registry_sets.py`` the daemon.
"""

from __future__ import annotations

from collections.abc import Sequence

from structlog.testing import capture_logs

from nodeagent.errors import StoreFull
from nodeagent.status import DiskStatus
from nodeagent.sync.copies import SetImages, StoredFromRegistry, StoreFailure
from tests.service.test_image_losses import MemoryRestorer
from tests.service.test_reconciler import GIB, A, B, C, Node, by_name, image_set


class MemoryRegistryStore:
    def __init__(self, restorer: MemoryRestorer, *, failing: Sequence[str] = ()) -> None:
        self.restorer = restorer
        self.failing = set(failing)
        self.calls: list[tuple[list[SetImages], DiskStatus | None]] = []

    async def store(
        self, sets: Sequence[SetImages], images_need: DiskStatus | None
    ) -> StoredFromRegistry:
        self.calls.append((list(sets), images_need))
        refs: list[str] = []
        failures = []
        for s in sets:
            if s.name in self.failing and s.missing:
                failures.append(StoreFailure(s.name, StoreFull.reason, "the store is full"))
                continue
            self.restorer.held.update(s.missing)
            refs.extend(s.missing)
        return StoredFromRegistry(tuple(refs), 100 * len(refs), tuple(failures))


def wired(node: Node, *, failing: Sequence[str] = ()) -> tuple[MemoryRestorer, MemoryRegistryStore]:
    restorer = MemoryRestorer(node)
    fetcher = MemoryRegistryStore(restorer, failing=failing)
    node.reconciler.restorer = restorer
    node.reconciler.registry_store = fetcher
    return restorer, fetcher


async def test_a_new_registry_set_goes_through_the_store_and_the_runtime_pulls_it_from_there() -> (
    None
):
    node = Node(image_set("apps", A, B))
    restorer, fetcher = wired(node)
    with capture_logs() as logs:
        status = await node.reconciler.sync()
    (sets, need), *_ = fetcher.calls
    assert sets == [SetImages("apps", (A, B), (A, B), ())]
    assert need is not None and need.needed_bytes > 0  # the runtime's admission came first
    assert restorer.calls == [[A, B]]
    assert node.crio.pull_calls == []  # nothing pulled from the registry by the runtime
    assert by_name(status)["apps"].state == "Pinned"
    stored = next(e for e in logs if e["event"] == "registry_images_stored")
    assert stored["images"] == 2

    await node.reconciler.sync()  # pinned: nothing to fetch, the set's pins handed on
    assert fetcher.calls[-1][0] == [SetImages("apps", (A, B), (), (A, B))]
    assert restorer.calls == [[A, B]]


async def test_what_the_store_refuses_is_pulled_from_the_registry_and_the_journal_says_why() -> (
    None
):
    node = Node(image_set("apps", A), image_set("web", B))
    restorer, _ = wired(node, failing=["apps"])
    with capture_logs() as logs:
        status = await node.reconciler.sync()
    warning = next(e for e in logs if e["event"] == "registry_set_not_stored")
    assert (warning["set"], warning["reason"], warning["log_level"]) == (
        "apps",
        "StoreFull",
        "warning",
    )
    assert "registry" in warning["next"]
    assert node.crio.pull_calls == [A]
    assert restorer.calls == [[B]]
    assert {s: by_name(status)[s].state for s in ("apps", "web")} == {
        "apps": "Pinned",
        "web": "Pinned",
    }


async def test_a_set_the_runtime_disk_refuses_is_not_fetched_into_the_store() -> None:
    node = Node(image_set("apps", A), image_set("big", B, C), available_bytes=2 * GIB)
    node.manifests.sizes[B] = node.manifests.sizes[C] = 1 * GIB
    restorer, fetcher = wired(node)
    status = await node.reconciler.sync()
    (sets, _), *_ = fetcher.calls
    assert {s.name: s.missing for s in sets} == {"apps": (A,), "big": ()}
    assert restorer.calls == [[A]]
    assert by_name(status)["big"].state == "Refused"
    assert B not in node.crio.pull_calls and C not in node.crio.pull_calls


async def test_images_the_store_holds_already_are_restored_not_fetched() -> None:
    node = Node(image_set("apps", A, B))
    restorer, fetcher = wired(node)
    restorer.held.add(A)
    await node.reconciler.sync()
    (sets, _), *_ = fetcher.calls
    assert sets == [SetImages("apps", (A, B), (B,), ())]
    assert restorer.calls == [[A], [B]]  # A restored first; B admitted, fetched, pulled
    assert node.crio.pull_calls == []


async def test_a_refused_set_is_reported_once_per_sync() -> None:
    node = Node(image_set("big", B, C), available_bytes=2 * GIB)
    node.manifests.sizes[B] = node.manifests.sizes[C] = 1 * GIB
    wired(node)
    with capture_logs() as logs:
        await node.reconciler.sync()
    assert [e["event"] for e in logs].count("disk_refused") == 1
    assert [e["event"] for e in logs].count("disk_admission") == 1
