"""Registry sets' records (``[store] registry_sets``): their form, their keep rules, their files."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.store import keeper
from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.errors import StoreRecordDamaged
from nodeagent.store import layout
from nodeagent.store.keeping import KeepRules, decide, newest_per_channel, referenced
from nodeagent.store.layout import BlobRef, BundleRecord, StoredImage, registry_record
from nodeagent.sync.copies import SetImages, admitted_only, registry_wants
from tests.unit.store.test_keeping import record as bundle_record

NOW = 10_000.0
GRACE_S = 600.0


def _digest(n: int) -> str:
    return f"sha256:{n:064x}"


def image(n: int) -> StoredImage:
    return StoredImage(
        f"reg.example/app-{n}@{_digest(n)}",
        _digest(n),
        500,
        "application/vnd.oci.image.manifest.v1+json",
    )


def set_record(
    name: str, *blobs: int, at_s: float = 0.0, images: tuple[int, ...] = (1,)
) -> BundleRecord:
    return registry_record(
        name,
        [image(n) for n in images],
        [BlobRef(_digest(n), 100 * n) for n in blobs],
        "2026-01-01T00:00:00Z",
        at_s,
    )


def test_a_registry_record_round_trips_and_names_only_its_set() -> None:
    kept = set_record("line-3.apps", 2, 3, 2)
    doc = kept.to_json()
    assert doc["source"] == "registry" and doc["setName"] == "line-3.apps"
    assert "keyId" not in doc and "bundleId" not in doc
    assert BundleRecord.from_json(json.loads(json.dumps(doc)), "r") == kept
    assert kept.is_registry and kept.sets == ("line-3.apps",)
    assert [b.digest for b in kept.blobs] == [_digest(2), _digest(3)]  # each blob once


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"setName": "../etc"}, "setName"),
        ({"setName": "UPPER"}, "setName"),
        ({"sets": ["apps", "other"]}, "sets must be"),
        ({"acceptedAt": -1}, "acceptedAt"),
        ({"source": "peer"}, "source must be"),
        ({"blobs": [{"digest": "sha256:00", "sizeBytes": 1}]}, "not a sha256 digest"),
    ],
)
def test_a_registry_record_nodeagent_cannot_have_written_is_damaged(
    change: dict[str, Any], needle: str
) -> None:
    doc = set_record("apps", 2).to_json() | change
    with pytest.raises(StoreRecordDamaged, match=needle):
        BundleRecord.from_json(doc, "r")


def test_set_dir_refuses_names_that_are_not_set_names() -> None:
    assert layout.set_dir("apps.v2") == "sets/apps.v2"
    for bad in ("", "..", "a/b", "A", "x" * 254):
        with pytest.raises(ValueError, match="not a set name"):
            layout.set_dir(bad)


@pytest.mark.parametrize(
    ("pinned", "at_s", "reasons"),
    [
        ({"apps"}, 0.0, ("pinned",)),
        (set(), NOW - GRACE_S + 1, ("recent",)),
        (set(), 0.0, ()),
        ({"other"}, 0.0, ()),
    ],
)
def test_a_registry_set_is_kept_while_pinned_or_just_fetched_never_as_newest(
    pinned: set[str], at_s: float, reasons: tuple[str, ...]
) -> None:
    records = [set_record("apps", 2, at_s=at_s)]
    rules = KeepRules(gc_grace_s=GRACE_S, keep_newest_per_channel=True)
    (verdict,) = decide(records, pinned, rules, NOW)
    assert verdict.reasons == reasons
    assert referenced([verdict]) == (frozenset({_digest(2)}) if reasons else frozenset())
    assert newest_per_channel(records) == set()
    assert ("released" in verdict.describe()) is (not reasons)


def test_a_layer_shared_with_a_bundle_is_kept_by_either() -> None:
    records = [bundle_record("b1", sets=("line",), blobs=(2, 4)), set_record("apps", 2, 3)]
    verdicts = decide(records, {"line"}, KeepRules(GRACE_S, False), NOW)
    assert referenced(verdicts) == frozenset({_digest(2), _digest(4)})
    verdicts = decide(records, {"apps"}, KeepRules(GRACE_S, False), NOW)
    assert referenced(verdicts) == frozenset({_digest(2), _digest(3)})


def _store_blob(store: Path, data: bytes) -> BlobRef:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs = BlobStore(store)
    blobs.ensure()
    filled = blobs.fill(digest, len(data), lambda _offset: io.BytesIO(data))
    blobs.commit(filled)
    return BlobRef(digest, len(data))


def test_records_load_bundles_and_sets_and_a_damaged_set_record_is_set_aside(
    tmp_path: Path,
) -> None:
    records = StoreRecords(tmp_path)
    records.write_set(set_record("apps", 2))
    records.write_set(set_record("web", 3))
    (tmp_path / "sets" / "web" / "record.json").write_text(
        '{"recordVersion": 1, "source": "registry"}'
    )
    (tmp_path / "sets" / "Not_A_Set").mkdir()

    read_only = records.load(is_repairing=False)
    assert [r.bundle_id for r in read_only.records] == ["apps"]
    assert (tmp_path / "sets" / "web" / "record.json").exists()  # a reader repairs nothing

    loaded = records.load()
    assert [r.bundle_id for r in loaded.records] == ["apps"]
    assert any("web" in line and "set aside" in line for line in loaded.repairs)
    assert not (tmp_path / "sets" / "web" / "record.json").exists()
    assert next(p.name for p in (tmp_path / "sets" / "web").iterdir()).startswith(
        "record.json.damaged-"
    )


def test_collect_forgets_a_released_registry_set_and_removes_its_blobs_after_the_grace(
    tmp_path: Path,
) -> None:
    own = _store_blob(tmp_path, b"own layer")
    shared = _store_blob(tmp_path, b"shared layer")
    records = StoreRecords(tmp_path)
    records.ensure_layout()
    top = StoredImage(f"reg.example/a@{own.digest}", own.digest, own.size_bytes, "application/x")
    records.write_set(registry_record("apps", [top], [own, shared], "t", 0.0))
    records.write_set(registry_record("web", [], [shared], "t", 0.0))
    rules = KeepRules(gc_grace_s=GRACE_S, keep_newest_per_channel=True)

    pinned_both = keeper.collect(tmp_path, {"apps", "web"}, rules, NOW)
    assert pinned_both.removed == ()
    index = json.loads((tmp_path / "index.json").read_text())
    assert [m["digest"] for m in index["manifests"]] == [own.digest]

    keeper.collect(tmp_path, {"web"}, rules, NOW)  # apps unpinned: its record goes
    assert not (tmp_path / "sets" / "apps").exists()
    assert json.loads((tmp_path / "index.json").read_text())["manifests"] == []
    early = keeper.collect(tmp_path, {"web"}, rules, NOW + GRACE_S - 1)
    assert early.removed == ()
    late = keeper.collect(tmp_path, {"web"}, rules, NOW + GRACE_S)
    assert late.removed == (own.digest,)  # the layer web shares stays
    assert set(BlobStore(tmp_path).stored()) == {shared.digest}


def test_registry_wants_splits_each_set_and_admission_keeps_only_admitted_fetches() -> None:
    a, b, c = "r/a@sha256:1", "r/b@sha256:2", "r/c@sha256:3"
    sets = registry_wants([("apps", [a, b]), ("web", [c])], {"apps": [a]}, {b, c})
    assert sets == [SetImages("apps", (a, b), (b,), (a,)), SetImages("web", (c,), (c,), ())]
    assert admitted_only(sets, ["web"]) == [SetImages("apps", (a, b), (), (a,)), sets[1]]
