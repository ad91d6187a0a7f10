"""copy_bundle, removal and verify on a real tmp filesystem, with signed generated bundles."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.http.mirror import BundleServer
from nodeagent.adapters.store import keeper
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import CopyStopped, StoreLimits, copy_bundle
from nodeagent.adapters.store.node_store import NodeImageStore
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.adapters.store.source import served_from_store
from nodeagent.bundles.manifest import BundleDigestMismatch, BundleManifestInvalid
from nodeagent.errors import InsufficientDiskSpace, StoreFull
from nodeagent.progress import ByteProgress
from nodeagent.store.keeping import KeepRules
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle
from tests.testenv.waiting import wait_for

MIB = 1 << 20
GRACE_S = 600.0


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys.make(tmp_path / "trusted")


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "layer-cache"


def _bundle(tmp_path: Path, keys: Keys, cache: Path, name: str, **kwargs: Any) -> Signed:
    """Bundle ``name``: a shared base layer (seed 1) plus a layer of its own."""
    own_seed = sum(name.encode())
    app = image(f"example/{name}", [(MIB, 1), (2 * MIB, own_seed)], cache)
    return signed_bundle(
        tmp_path / name, keys, [app], bundle_id=name, set_name=f"set-{name}", **kwargs
    )


def _copy(store: Path, bundle: Signed, keys: Keys) -> keeper.Verified:
    copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    return keeper.verify(store)


def test_a_bundle_is_copied_whole_and_named_in_the_oci_index(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    bundle = _bundle(tmp_path, keys, cache, "alpha", channel="stable")
    store = tmp_path / "store"
    shown: list[ByteProgress] = []
    result = copy_bundle(
        store, bundle.root, bundle.manifest, keys.trusted_dir, on_progress=shown.append
    )
    total = sum(f.size_bytes for f in bundle.manifest.blobs.values())
    count = len(bundle.manifest.blobs)  # the manifest, the config and two layers
    assert (result.blobs_copied, result.bytes_copied, result.bytes_read) == (count, total, total)
    assert set(BlobStore(store).stored()) == set(bundle.manifest.blobs)
    assert shown[-1].is_final and shown[-1].done_bytes == total
    index = json.loads((store / "index.json").read_text())
    names = [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]]
    assert names == [str(i.ref) for i in bundle.manifest.images]
    kept = store / "bundles" / "alpha"
    assert (kept / "bundle.json").read_bytes() == (bundle.root / "bundle.json").read_bytes()
    assert (kept / "bundle.json.minisig").read_bytes() == (
        bundle.root / "bundle.json.minisig"
    ).read_bytes()
    (record,) = StoreRecords(store).load().records
    assert (record.key_id, record.channel, record.sets) == (
        keys.key_id_hex,
        "stable",
        ("set-alpha",),
    )
    again = copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    assert (again.blobs_copied, again.blobs_present, again.bytes_read) == (0, count, 0)


def test_shared_layers_are_stored_once_and_unpinning_frees_only_own_blobs(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    alpha = _bundle(tmp_path, keys, cache, "alpha", created="2026-01-01T00:00:00Z")
    beta = _bundle(tmp_path, keys, cache, "beta", created="2026-02-01T00:00:00Z")
    store = tmp_path / "store"
    copy_bundle(store, alpha.root, alpha.manifest, keys.trusted_dir)
    second = copy_bundle(store, beta.root, beta.manifest, keys.trusted_dir)
    shared = set(alpha.manifest.blobs) & set(beta.manifest.blobs)
    assert len(shared) == 1  # the base layer
    assert second.blobs_present == 1 and second.bytes_copied < sum(
        f.size_bytes for f in beta.manifest.blobs.values()
    )
    assert set(BlobStore(store).stored()) == set(alpha.manifest.blobs) | set(beta.manifest.blobs)

    rules = KeepRules(gc_grace_s=GRACE_S, keep_newest_per_channel=True)
    now = keeper.inspect_store(store, (), rules, 0).verdicts[0].record.accepted_at_s + GRACE_S
    pinned = {"set-beta"}  # set-alpha was unpinned
    first = keeper.collect(store, pinned, rules, now)
    assert first.removed == ()  # marked only: the grace period starts now
    marked = set(first.view.removals.marks)
    assert marked == set(alpha.manifest.blobs) - shared
    early = keeper.collect(store, pinned, rules, now + GRACE_S - 1)
    assert early.removed == ()
    late = keeper.collect(store, pinned, rules, now + GRACE_S)
    assert set(late.removed) == marked
    assert set(BlobStore(store).stored()) == set(beta.manifest.blobs)
    assert (store / "bundles" / "alpha" / "bundle.json").exists()  # the signed manifest stays
    index = json.loads((store / "index.json").read_text())
    assert [m["digest"] for m in index["manifests"]] == [beta.manifest.images[0].manifest_digest]
    assert keeper.verify(store).is_ok


def test_the_size_cap_refuses_before_the_first_byte(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    bundle = _bundle(tmp_path, keys, cache, "alpha")
    store = tmp_path / "store"
    with pytest.raises(StoreFull, match=r"raise \[store\] max_bytes"):
        copy_bundle(
            store,
            bundle.root,
            bundle.manifest,
            keys.trusted_dir,
            limits=StoreLimits(max_bytes=2 * MIB),
        )
    with pytest.raises(InsufficientDiskSpace, match="image store"):
        copy_bundle(
            store,
            bundle.root,
            bundle.manifest,
            keys.trusted_dir,
            limits=StoreLimits(reserve_bytes=1 << 60),
        )
    assert BlobStore(store).stored() == {}
    assert list((store / "tmp").iterdir()) == []
    assert not (store / "bundles" / "alpha").exists()


def test_a_bundle_of_held_blobs_is_recorded_even_on_a_full_disk(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    """Nothing to copy: the newer bundle's signed manifest and record are written (its
    tags are served, its blobs kept for it), whatever the space or the cap left."""
    store = tmp_path / "store"
    older = _bundle(tmp_path, keys, cache, "alpha")
    copy_bundle(store, older.root, older.manifest, keys.trusted_dir)
    newer = signed_bundle(
        tmp_path / "newer", keys, older.images, bundle_id="beta", set_name="set-beta"
    )
    full = StoreLimits(max_bytes=1, reserve_bytes=1 << 60)
    done = copy_bundle(store, newer.root, newer.manifest, keys.trusted_dir, limits=full)
    assert done.blobs_copied == 0 and done.bytes_copied == 0
    ids = sorted(r.bundle_id for r in StoreRecords(store).load().records)
    assert ids == ["alpha", "beta"]
    assert (store / "bundles" / "beta" / "bundle.json").read_bytes() == (
        newer.root / "bundle.json"
    ).read_bytes()


def test_a_damaged_blob_on_the_medium_refuses_the_bundle(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    bundle = _bundle(tmp_path, keys, cache, "alpha")
    layer = max(bundle.manifest.blobs.items(), key=lambda item: item[1].size_bytes)[0]
    path = bundle.blob_file(layer)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    store = tmp_path / "store"
    with pytest.raises(BundleDigestMismatch):
        copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    assert layer not in BlobStore(store).stored()
    assert not (store / "bundles" / "alpha").exists()
    assert list((store / "tmp").iterdir()) == []


def test_a_refused_copy_names_what_it_stored_and_those_blobs_can_be_discarded(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    """Decision 0081: the copy names each blob once it is stored (the importer's pulls wait
    for them); a refused copy's blobs are discarded at once, except those another stored
    bundle lists (the base layer alpha shares with beta)."""
    alpha = _bundle(tmp_path, keys, cache, "alpha")
    beta = _bundle(tmp_path, keys, cache, "beta")
    store = tmp_path / "store"
    copy_bundle(store, alpha.root, alpha.manifest, keys.trusted_dir)
    own = max(beta.manifest.blobs.items(), key=lambda item: item[1].size_bytes)[0]
    path = beta.blob_file(own)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    told: list[str] = []
    with pytest.raises(BundleDigestMismatch):
        copy_bundle(store, beta.root, beta.manifest, keys.trusted_dir, on_stored=told.append)
    stored = BlobStore(store).stored()
    assert told and set(told) <= set(stored) and own not in told
    assert set(told).isdisjoint(alpha.manifest.blobs)  # already there: not copied again
    node = NodeImageStore(store, keys.trusted_dir, StoreLimits())
    body = node.read_manifest(alpha.manifest.images[0].manifest_digest)
    assert body is not None and len(json.loads(body)["layers"]) == 2
    assert node.read_manifest(own) is None  # refused: never stored
    shared = set(alpha.manifest.blobs) & set(beta.manifest.blobs)
    count, freed = node.discard([*told, *shared])
    assert count == len(told) and freed == sum(stored[d] for d in told)
    assert set(BlobStore(store).stored()) == set(alpha.manifest.blobs)
    assert keeper.verify(store).is_ok


def test_a_medium_whose_manifest_changed_is_refused(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    alpha = _bundle(tmp_path, keys, cache, "alpha")
    beta = _bundle(tmp_path, keys, cache, "beta")
    with pytest.raises(BundleManifestInvalid, match="no longer the one verified"):
        copy_bundle(tmp_path / "store", alpha.root, beta.manifest, keys.trusted_dir)


def test_verify_finds_removes_and_reports_a_blob_corrupted_on_disk(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    bundle = _bundle(tmp_path, keys, cache, "alpha")
    store = tmp_path / "store"
    assert _copy(store, bundle, keys).is_ok
    victim = bundle.manifest.images[0].manifest_digest
    path = BlobStore(store).path(victim)
    path.write_bytes(path.read_bytes().replace(b"schemaVersion", b"schemaVersioN"))
    report = keeper.verify(store)
    assert [digest for digest, _ in report.corrupt] == [victim]
    assert report.checked == len(bundle.manifest.blobs)
    assert victim not in BlobStore(store).stored()
    assert json.loads((store / "index.json").read_text())["manifests"] == []
    again = copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    assert again.blobs_copied == 1  # fetched again from a source that has it
    assert keeper.verify(store).is_ok


def test_a_damaged_record_is_set_aside_and_rebuilt(tmp_path: Path, keys: Keys, cache: Path) -> None:
    bundle = _bundle(tmp_path, keys, cache, "alpha", channel="edge")
    store = tmp_path / "store"
    copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    (store / "bundles" / "alpha" / "record.json").write_text('{"recordVersion": 1, "x": NaN}')
    shown = keeper.inspect_store(store, (), KeepRules(), 0.0)  # read only: nothing moved
    assert shown.repairs == ("alpha: record damaged, read from its bundle.json for now",)
    assert [v.record.channel for v in shown.verdicts] == ["edge"]
    assert len(list((store / "bundles/alpha").iterdir())) == 3
    loaded = StoreRecords(store).load()
    assert [r.channel for r in loaded.records] == ["edge"]
    assert loaded.repairs == ("alpha: record damaged, rebuilt from its bundle.json",)
    assert any(
        p.name.startswith("record.json.damaged-") for p in (store / "bundles/alpha").iterdir()
    )


_CHILD = """
import sys, time
from pathlib import Path
from nodeagent.adapters.store import copier, prefetch
from nodeagent.bundles.manifest import parse_manifest

original = prefetch.Prefetcher._put
def slow(self, digest, item):  # a slow medium, so the copy can be killed in the middle of a blob
    time.sleep(0.02)
    return original(self, digest, item)
prefetch.Prefetcher._put = slow
prefetch.QUEUE_CHUNKS = 1
medium, store, keys = map(Path, sys.argv[1:4])
manifest = parse_manifest((medium / "bundle.json").read_bytes())
copier.copy_bundle(store, medium, manifest, keys, chunk_bytes=128 << 10)
"""


def test_a_copy_killed_mid_blob_resumes_without_reading_the_prefix_again(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    app = image("example/big", [(4 * MIB, 7), (4 * MIB, 8)], cache)
    bundle = signed_bundle(tmp_path / "big", keys, [app], bundle_id="big", set_name="big")
    store = tmp_path / "store"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(bundle.root), str(store), str(keys.trusted_dir)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )

    def partials() -> dict[str, tuple[int, float]]:
        return BlobStore(store).partials() if (store / "tmp").exists() else {}

    try:
        wait_for(
            lambda: any(size >= MIB for size, _ in partials().values()),
            timeout_s=60,
            what="the child to be in the middle of a layer",
        )
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    left = {digest: size for digest, (size, _) in partials().items()}
    assert left and not (store / "bundles" / "big" / "record.json").exists()
    stored_before = BlobStore(store).stored()
    result = copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    missing = {d: f.size_bytes for d, f in bundle.manifest.blobs.items() if d not in stored_before}
    assert result.bytes_copied == sum(missing.values())
    assert result.bytes_read == sum(missing.values()) - sum(left.values())
    assert keeper.verify(store).is_ok
    assert set(BlobStore(store).stored()) == set(bundle.manifest.blobs)


def test_a_copy_told_to_stop_records_nothing_and_the_next_resumes(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    """An import cancelled mid-copy (its medium reported removed while still readable, or the
    daemon stopping) stops its copy at the next chunk: no record, so nothing half-imported
    is held or served; the next copy resumes what was stored."""
    app = image("example/stop", [(4 * MIB, 17), (4 * MIB, 18)], cache)
    bundle = signed_bundle(tmp_path / "stop", keys, [app], bundle_id="stop", set_name="stop")
    store = tmp_path / "store"
    asked = 0

    def after_two_chunks() -> bool:
        nonlocal asked
        asked += 1
        return asked > 2

    with pytest.raises(CopyStopped):
        copy_bundle(
            store,
            bundle.root,
            bundle.manifest,
            keys.trusted_dir,
            chunk_bytes=256 << 10,
            should_stop=after_two_chunks,
        )
    assert asked == 3  # asked as each chunk is written; no chunk read after the yes
    assert not (store / "bundles" / "stop" / "record.json").exists()
    left = sum(size for size, _ in BlobStore(store).partials().values())
    stored = {d: bundle.manifest.blobs[d].size_bytes for d in BlobStore(store).stored()}
    assert (
        0 < left + sum(stored.values()) < sum(f.size_bytes for f in bundle.manifest.blobs.values())
    )
    result = copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    assert result.bytes_read == result.bytes_copied - left
    assert keeper.verify(store).is_ok
    assert (store / "bundles" / "stop" / "record.json").exists()


@pytest.mark.needs("skopeo")
def test_skopeo_reads_a_stored_image_by_its_reference(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    bundle = _bundle(tmp_path, keys, cache, "alpha")
    store = tmp_path / "store"
    copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    ref = str(bundle.manifest.images[0].ref)
    shown = subprocess.run(
        ["skopeo", "inspect", "--raw", f"oci:{store}:{ref}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["layers"][0]["digest"] in bundle.manifest.blobs
    copied = subprocess.run(
        ["skopeo", "copy", f"oci:{store}:{ref}", f"dir:{tmp_path / 'out'}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert copied.returncode == 0, copied.stderr


async def _fetch(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_the_loopback_bundle_server_serves_from_the_store_and_refuses_damage(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    bundle = _bundle(tmp_path, keys, cache, "alpha")
    store = tmp_path / "store"
    copy_bundle(store, bundle.root, bundle.manifest, keys.trusted_dir)
    shutil.rmtree(bundle.root)  # the stick is gone
    image_ref = bundle.manifest.images[0]
    layer = max(bundle.manifest.blobs.items(), key=lambda item: item[1].size_bytes)[0]
    damaged = BlobStore(store).path(layer)
    good = damaged.read_bytes()

    async def scenario() -> list[tuple[int, bytes]]:
        async with BundleServer(store, served_from_store(bundle.manifest)) as server:
            manifest = await _fetch(
                server.port, f"/v2/example/alpha/manifests/{image_ref.manifest_digest}"
            )
            blob = await _fetch(server.port, f"/v2/example/alpha/blobs/{layer}")
            return [manifest, blob, *([] if server.rejections else [(0, b"")])]

    manifest, blob, *_ = asyncio.run(scenario())
    assert manifest[0] == 200 and blob == (200, good)
    damaged.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    results = asyncio.run(scenario())
    assert len(results[1][1]) < len(good)  # the last chunk is held back: never whole
    assert len(results) == 2  # and the server reported the damage


def test_progress_comes_at_most_every_two_seconds_and_once_at_the_end(
    tmp_path: Path, keys: Keys, cache: Path
) -> None:
    app = image("example/many", [(MIB, n) for n in range(40, 52)], cache)  # 12 layers
    bundle = signed_bundle(tmp_path / "many", keys, [app], bundle_id="many", set_name="many")
    ticks = iter(range(10_000))
    shown: list[ByteProgress] = []
    copy_bundle(
        tmp_path / "store",
        bundle.root,
        bundle.manifest,
        keys.trusted_dir,
        on_progress=shown.append,
        clock=lambda: next(ticks) * 0.25,  # every look at the clock: a quarter second later
        chunk_bytes=256 << 10,
    )
    total = sum(f.size_bytes for f in bundle.manifest.blobs.values())
    assert shown[-1].is_final and shown[-1].done_bytes == total
    steps = [later.elapsed_s - earlier.elapsed_s for earlier, later in pairwise(shown[:-1])]
    assert len(shown) > 3 and min(steps) >= 2.0
    assert all(p.rate_bytes_per_s and p.eta_s is not None for p in shown[:-1])
    assert [p.done_bytes for p in shown] == sorted(p.done_bytes for p in shown)


@pytest.mark.parametrize("threads", [1, 4])
def test_verify_in_threads_finds_every_damaged_blob_and_counts_every_byte(
    tmp_path: Path, keys: Keys, cache: Path, threads: int
) -> None:
    """Blobs are hashed several at a time, the largest first: every byte is counted once
    (``on_bytes`` is called one call at a time, its total never going back), and every
    damaged blob is found and removed, reported in digest order."""
    bundle = _bundle(tmp_path, keys, cache, "alpha")
    store = tmp_path / "store"
    assert _copy(store, bundle, keys).is_ok
    victims = sorted(image.manifest_digest for image in bundle.manifest.images)
    for victim in victims:
        path = BlobStore(store).path(victim)
        path.write_bytes(path.read_bytes().replace(b"schemaVersion", b"schemaVersioN"))
    total = sum(BlobStore(store).stored().values())
    seen: list[int] = []

    report = keeper.verify(store, lambda done, _total: seen.append(done), threads=threads)

    assert [digest for digest, _ in report.corrupt] == victims
    assert report.checked == len(bundle.manifest.blobs)
    assert report.checked_bytes == total == seen[-1]
    assert seen == sorted(seen)
    assert not set(victims) & set(BlobStore(store).stored())
