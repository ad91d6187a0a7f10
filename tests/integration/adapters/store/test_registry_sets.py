"""``adapters.store.registry_sets.RegistrySets`` against the real registry behind a counting
proxy: each blob fetched once into the store, verified, recorded; admission before the first
byte; a failed download leaves nothing; a set's record follows its images."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.adapters.registry.client import RegistryClient
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import StoreLimits
from nodeagent.adapters.store.node_store import NodeImageStore
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.adapters.store.registry_sets import ChunkPipe, RegistrySets
from nodeagent.registries import Platform
from nodeagent.status import DiskStatus
from nodeagent.sync.copies import SetImages
from tests.conftest import Pushed
from tests.testenv.faulty_proxy import FaultyProxy
from tests.unit.store.test_keeping import record as bundle_record

AMD64 = Platform("linux", "amd64")
NO_LIMITS = StoreLimits()


@pytest.fixture
def front(pushed: Pushed) -> Iterator[FaultyProxy]:
    with FaultyProxy(pushed.host) as proxy:
        yield proxy


def sets_of(
    store: Path, front: FaultyProxy, *, limits: StoreLimits = NO_LIMITS, timeout_s: float = 10.0
) -> RegistrySets:
    client = RegistryClient(insecure={front.host}, timeout_s=timeout_s)
    return RegistrySets(store, client, lambda _ref: None, AMD64, limits, clock=lambda: 1000.0)


def refs_of(pushed: Pushed, front: FaultyProxy) -> list[str]:
    images = (pushed.base_a, pushed.base_b, pushed.multiarch)
    return [pushed.ref(i).replace(pushed.host, front.host) for i in images]


def wanted(name: str, refs: list[str], missing: list[str] | None = None) -> SetImages:
    return SetImages(name, tuple(refs), tuple(refs if missing is None else missing), ())


def stored(store: Path) -> dict[str, int]:
    return BlobStore(store).stored()


async def test_a_set_is_stored_once_verified_recorded_and_then_restorable(
    pushed: Pushed, front: FaultyProxy, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    refs = refs_of(pushed, front)
    outcome = await sets_of(store, front).store([wanted("apps", refs)], None)
    assert outcome.failures == ()
    assert sorted(outcome.refs) == sorted(refs)
    (record,) = StoreRecords(store).load().records
    assert record.is_registry and record.accepted_at_s == 1000.0
    assert {b.digest: b.size_bytes for b in record.blobs}.items() <= stored(store).items()
    assert outcome.fetched_bytes == sum(stored(store).values())
    fetches = front.blob_fetches()
    assert set(fetches.values()) == {1}  # the base layer app-a and app-b share: once
    multi = pushed.multiarch
    assert multi.child_digests[1] not in stored(store)  # the arm64 child is not this node's
    assert multi.child_digests[0] in stored(store)
    assert list((store / "tmp").iterdir()) == []
    index = json.loads((store / "index.json").read_text())
    assert len(index["manifests"]) == 3
    restorable = NodeImageStore(store, tmp_path / "keys", StoreLimits()).restorable(refs)
    assert sorted(restorable.refs) == sorted(refs)

    again = await sets_of(store, front).store([wanted("apps", refs)], None)
    assert again.fetched_bytes == 0
    assert front.blob_fetches() == fetches  # nothing read twice


async def test_a_blob_gone_from_the_store_is_fetched_again_alone(
    pushed: Pushed, front: FaultyProxy, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    ref = refs_of(pushed, front)[0]
    await sets_of(store, front).store([wanted("apps", [ref])], None)
    layer = pushed.base_a.layer_digests[-1]
    BlobStore(store).remove(layer)  # what nodeagent store verify does to a corrupt blob
    assert NodeImageStore(store, tmp_path, StoreLimits()).restorable([ref]).refs == ()
    before = front.blob_fetches()
    await sets_of(store, front).store([wanted("apps", [ref])], None)
    after = front.blob_fetches()
    assert {d: n - before.get(d, 0) for d, n in after.items() if n != before.get(d, 0)} == {
        layer: 1
    }
    assert NodeImageStore(store, tmp_path, StoreLimits()).restorable([ref]).refs == (ref,)


async def test_the_cap_and_the_runtime_need_refuse_before_the_first_byte(
    pushed: Pushed, front: FaultyProxy, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    ref = refs_of(pushed, front)[0]
    capped = await sets_of(store, front, limits=StoreLimits(max_bytes=4096)).store(
        [wanted("apps", [ref])], None
    )
    (failure,) = capped.failures
    assert (failure.set_name, failure.reason) == ("apps", "StoreFull")
    assert "set apps from its registry needs" in failure.message
    # the images themselves would take all the free space of the store's filesystem
    huge = DiskStatus(str(tmp_path), 0, 1 << 62, 0)
    full = await sets_of(store, front).store([wanted("apps", [ref])], huge)
    assert [f.reason for f in full.failures] == ["InsufficientDiskSpace"]
    assert stored(store) == {} and front.blob_fetches() == {}
    assert not (store / "sets" / "apps").exists()


async def test_a_download_cut_short_stores_nothing_and_leaves_no_partial(
    pushed: Pushed, front: FaultyProxy, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    ref = refs_of(pushed, front)[0]
    front.stall_bodies(after_bytes=1024, match=lambda r: r.is_blob and r.path.endswith(
        pushed.base_a.layer_digests[0]))  # fmt: skip
    outcome = await sets_of(store, front, timeout_s=2.0).store([wanted("apps", [ref])], None)
    assert [f.reason for f in outcome.failures] == ["RegistryUnavailable"]
    assert pushed.base_a.layer_digests[0] not in stored(store)
    assert list((store / "tmp").iterdir()) == []
    assert not (store / "sets" / "apps").exists()


async def test_a_bundle_set_is_left_to_its_bundle_and_a_set_record_follows_its_images(
    pushed: Pushed, front: FaultyProxy, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    a, b, _ = refs_of(pushed, front)
    records = StoreRecords(store)
    records.write_bundle(bundle_record("b1", sets=("line",)), b"{}", b"sig")
    fetcher = sets_of(store, front)
    assert (await fetcher.store([wanted("line", [a])], None)).refs == ()
    assert stored(store) == {}

    await fetcher.store([wanted("apps", [a, b])], None)
    # a new generation of apps has b only; a is still pinned (the generation is not
    # complete yet): a stays recorded, so its blobs stay
    await fetcher.store([SetImages("apps", (b,), (), (a, b))], None)
    (kept,) = [r for r in records.load().records if r.is_registry]
    assert sorted(i.name for i in kept.images) == sorted([a, b])
    # the new generation pinned: the record follows, a's own layer is no longer claimed
    # (even with a cap lowered below what the store holds: pruning adds nothing)
    lowered = sets_of(store, front, limits=StoreLimits(max_bytes=1))
    assert (await lowered.store([SetImages("apps", (b,), (), (b,))], None)).failures == ()
    (kept,) = [r for r in records.load().records if r.is_registry]
    assert [i.name for i in kept.images] == [b]
    own_a = pushed.base_a.layer_digests[-1]
    assert own_a not in kept.digests and pushed.base_b.layer_digests[-1] in kept.digests
    assert front.blob_fetches().get(own_a) == 1


def test_the_pipe_hands_chunks_over_bounded_and_ends_or_fails() -> None:
    pipe = ChunkPipe()
    written: list[int] = []

    def writer() -> None:
        for n in range(20):
            written.append(pipe.write(bytes([n]) * 1000))
        pipe.end()

    thread = threading.Thread(target=writer)
    thread.start()
    buffer = memoryview(bytearray(300))
    got = bytearray()
    while count := pipe.readinto(buffer):
        got += buffer[:count]
    thread.join(timeout=10)
    assert got == b"".join(bytes([n]) * 1000 for n in range(20)) and len(written) == 20

    failing = ChunkPipe()
    failing.write(b"x")
    failing.end(ConnectionResetError("reset"))
    assert failing.readinto(buffer) == 1
    with pytest.raises(Exception, match="reset"):
        failing.readinto(buffer)

    gone = ChunkPipe()
    gone.close_reader()
    with pytest.raises(BrokenPipeError):
        gone.write(b"x")
