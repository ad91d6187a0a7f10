"""The store's holdings as the publisher sees them: complete, started, and damaged bundles."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from nodeagent.adapters.store.holdings import StoreHoldings
from nodeagent.adapters.store.offer import FRESH_PARTIAL_S, read_offer
from nodeagent.cluster.holdings import HeldBundle, HeldTarget
from nodeagent.store import layout
from tests.testenv.store_bundles import digest_of, store_bundle

BLOBS = [b"top manifest", b"layer one" * 100, b"layer two" * 50]
SIZE = sum(len(b) for b in BLOBS)
EVERY_AMD64 = HeldTarget("amd64", "")


def test_an_empty_or_missing_store_holds_nothing(tmp_path: Path) -> None:
    assert StoreHoldings(tmp_path / "absent").scan() == ()
    assert StoreHoldings(tmp_path).scan() == ()


def test_a_recorded_bundle_with_every_blob_is_complete(tmp_path: Path) -> None:
    digest = store_bundle(tmp_path, "site-1", BLOBS)
    manifest = (tmp_path / "bundles" / "site-1" / "bundle.json").read_bytes()
    assert digest == "sha256:" + hashlib.sha256(manifest).hexdigest()
    assert StoreHoldings(tmp_path).scan() == (
        HeldBundle("site-1", digest, True, 3, SIZE, EVERY_AMD64),
    )


def test_a_fetch_under_way_is_started_with_the_manifests_totals(tmp_path: Path) -> None:
    digest = store_bundle(tmp_path, "site-1", BLOBS, is_recorded=False, stored=1)
    assert StoreHoldings(tmp_path).scan() == (
        HeldBundle("site-1", digest, False, 3, SIZE, EVERY_AMD64),
    )


def test_a_blob_gone_from_a_recorded_bundle_makes_it_incomplete(tmp_path: Path) -> None:
    store_bundle(tmp_path, "site-1", BLOBS)
    (tmp_path / layout.blob_path(digest_of(BLOBS[2]))).unlink()
    ((held,),) = [StoreHoldings(tmp_path).scan()]
    assert not held.is_complete


def test_a_directory_without_manifest_or_signature_or_with_a_foreign_one_is_skipped(
    tmp_path: Path,
) -> None:
    store_bundle(tmp_path, "site-1", BLOBS, is_recorded=False)
    (tmp_path / "bundles" / "site-1" / "bundle.json.minisig").unlink()
    (tmp_path / "bundles" / "empty").mkdir()
    store_bundle(tmp_path, "other", BLOBS, is_recorded=False)
    (tmp_path / "bundles" / "other").rename(tmp_path / "bundles" / "renamed")
    assert StoreHoldings(tmp_path).scan() == ()


def test_a_changed_manifest_is_hashed_again(tmp_path: Path) -> None:
    holdings = StoreHoldings(tmp_path)
    first = store_bundle(tmp_path, "site-1", BLOBS)
    assert holdings.scan()[0].manifest_digest == first
    second = store_bundle(tmp_path, "site-1", BLOBS, note="re-signed")
    assert second != first
    assert holdings.scan()[0].manifest_digest == second


def test_the_target_of_the_stored_manifest_is_published_in_canonical_form(tmp_path: Path) -> None:
    store_bundle(tmp_path, "site-1", BLOBS, node_selector="zone=b, role in (edge)")
    store_bundle(tmp_path, "site-2", BLOBS, is_recorded=False, node_selector="role=edge")
    held = {b.bundle_id: b.target for b in StoreHoldings(tmp_path).scan()}
    assert held == {
        "site-1": HeldTarget("amd64", "role=edge,zone=b"),
        "site-2": HeldTarget("amd64", "role=edge"),
    }


def test_the_offer_says_which_blobs_are_being_fetched_now(tmp_path: Path) -> None:
    store_bundle(tmp_path, "site-1", BLOBS, is_recorded=False, stored=1)
    fresh, stale = digest_of(BLOBS[1]), digest_of(BLOBS[2])
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    for digest, mtime in ((fresh, 1_000_000.0), (stale, 1_000_000.0 - FRESH_PARTIAL_S - 1)):
        partial = tmp / f"{digest.removeprefix('sha256:')}.partial"
        partial.write_bytes(b"part")
        os.utime(partial, (mtime, mtime))
    offer = read_offer(tmp_path, now_s=1_000_000.0)
    assert offer.fetching == {fresh}  # the stale one was left by a cut transfer
    assert digest_of(BLOBS[0]) in offer.stored and fresh not in offer.stored
    store_bundle(tmp_path / "recorded", "site-2", BLOBS)  # a whole bundle fetches nothing
    assert read_offer(tmp_path / "recorded").fetching == frozenset()
