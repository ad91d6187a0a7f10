"""A new bundle is offered to the site while its medium is copied (``copier.seeding``):
its signed manifest first, each blob served as soon as it is stored, and the node's own
fetcher kept off it; a copy that fails or stops takes the manifest back."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import (
    MEDIUM_MARK,
    CopyStopped,
    StoreLimits,
    copy_bundle,
    copying,
)
from nodeagent.adapters.store.fetched import FetchStore
from nodeagent.adapters.store.offer import FETCHING, read_offer
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle

MIB = 1 << 20
CHUNK = 256 << 10


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys.make(tmp_path / "trusted")


def _bundle(tmp_path: Path, keys: Keys) -> Signed:
    app = image("example/seed", [(2 * MIB, 41), (2 * MIB, 42)], tmp_path / "cache")
    return signed_bundle(tmp_path / "seed", keys, [app], bundle_id="seed", set_name="seed")


def test_a_new_bundle_is_offered_while_it_is_copied_and_recorded_at_the_end(
    tmp_path: Path, keys: Keys
) -> None:
    bundle = _bundle(tmp_path, keys)
    store = tmp_path / "store"
    fetch_store = FetchStore(store, keys.trusted_dir, StoreLimits())
    digest = "sha256:" + hashlib.sha256((bundle.root / "bundle.json").read_bytes()).hexdigest()
    seen: list[tuple[frozenset[str], int, bool]] = []

    def look() -> bool:
        offer = read_offer(store)
        offered = offer.bundles.get("seed")
        assert offered is not None and offered.accepted_at_s == FETCHING
        assert offered.manifest_digest == digest
        assert fetch_store.held() == {"seed": (digest, True)}  # the copy's, not the fetcher's
        assert fetch_store.unfinished() == []
        assert not (store / "bundles" / "seed" / "record.json").exists()
        seen.append((offer.stored, len(BlobStore(store).stored()), "seed" in copying(store)))
        return False

    copy_bundle(
        store, bundle.root, bundle.manifest, keys.trusted_dir, chunk_bytes=CHUNK, should_stop=look
    )
    assert all(is_copying for _, _, is_copying in seen)
    assert all(len(offered) == held for offered, held, _ in seen)  # each stored blob, offered
    assert seen[-1][1] > 0  # blobs were served before the copy ended
    assert copying(store) == frozenset()
    assert (store / "bundles" / "seed" / "record.json").exists()
    assert fetch_store.held() == {"seed": (digest, True)}
    assert read_offer(store).bundles["seed"].accepted_at_s != FETCHING
    fetch_store.close()


def test_a_stopped_copy_takes_its_manifest_back(tmp_path: Path, keys: Keys) -> None:
    bundle = _bundle(tmp_path, keys)
    store = tmp_path / "store"
    asked = 0

    def after_three_chunks() -> bool:
        nonlocal asked
        asked += 1
        return asked > 3

    with pytest.raises(CopyStopped):
        copy_bundle(
            store,
            bundle.root,
            bundle.manifest,
            keys.trusted_dir,
            chunk_bytes=CHUNK,
            should_stop=after_three_chunks,
        )
    assert not (store / "bundles" / "seed").exists()
    assert "seed" not in read_offer(store).bundles
    assert copying(store) == frozenset()
    copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    assert (store / "bundles" / "seed" / "record.json").exists()


def test_a_bundle_being_fetched_is_not_rewritten_nor_withdrawn_by_a_copy(
    tmp_path: Path, keys: Keys
) -> None:
    """A manifest already in the store (a fetch under way) is not the copy's: a copy that
    stops leaves it, and the fetcher may still resume it."""
    bundle = _bundle(tmp_path, keys)
    store = tmp_path / "store"
    fetch_store = FetchStore(store, keys.trusted_dir, StoreLimits())
    signed = fetch_store.verify(
        (bundle.root / "bundle.json").read_bytes(),
        (bundle.root / "bundle.json.minisig").read_bytes(),
    )
    fetch_store.begin(signed)
    with pytest.raises(CopyStopped):
        copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir, should_stop=lambda: True)
    assert (store / "bundles" / "seed" / "bundle.json").read_bytes() == signed.data
    assert [s.manifest_digest for s in fetch_store.unfinished()] == [signed.manifest_digest]
    fetch_store.close()


def _cut_copy(tmp_path: Path, keys: Keys, bundle: Signed) -> Path:
    """What a copy killed mid-way leaves: its mark, the early manifest and signature, some
    blobs, no record (copied by a copy stopped early, then the files written back)."""
    store = tmp_path / "store"
    with pytest.raises(CopyStopped):
        copy_bundle(
            store,
            bundle.root,
            bundle.manifest,
            keys.trusted_dir,
            chunk_bytes=CHUNK,
            should_stop=iter([False] * 9 + [True]).__next__,
        )
    directory = store / "bundles" / "seed"
    directory.mkdir(parents=True)
    (directory / MEDIUM_MARK).write_bytes(b"")
    for name in ("bundle.json", "bundle.json.minisig"):
        (directory / name).write_bytes((bundle.root / name).read_bytes())
    return store


def test_a_copy_cut_short_is_neither_held_nor_resumed_by_the_fetcher_and_a_copy_ends_it(
    tmp_path: Path, keys: Keys
) -> None:
    bundle = _bundle(tmp_path, keys)
    store = _cut_copy(tmp_path, keys, bundle)
    fetch_store = FetchStore(store, keys.trusted_dir, StoreLimits())
    assert fetch_store.held() == {}
    assert fetch_store.unfinished() == []
    result = copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    assert 0 < result.blobs_copied < len(bundle.manifest.blobs)
    assert (store / "bundles" / "seed" / "record.json").exists()
    assert not (store / "bundles" / "seed" / MEDIUM_MARK).exists()
    assert fetch_store.held()["seed"][1] is True
    fetch_store.close()


def test_a_fetch_takes_over_a_copy_cut_short(tmp_path: Path, keys: Keys) -> None:
    bundle = _bundle(tmp_path, keys)
    store = _cut_copy(tmp_path, keys, bundle)
    fetch_store = FetchStore(store, keys.trusted_dir, StoreLimits())
    signed = fetch_store.verify(
        (bundle.root / "bundle.json").read_bytes(),
        (bundle.root / "bundle.json.minisig").read_bytes(),
    )
    fetch_store.begin(signed)
    assert not (store / "bundles" / "seed" / MEDIUM_MARK).exists()
    assert [s.manifest_digest for s in fetch_store.unfinished()] == [signed.manifest_digest]
    assert fetch_store.held() == {"seed": (signed.manifest_digest, False)}
    fetch_store.close()
