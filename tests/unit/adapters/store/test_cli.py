"""``nodeagent store`` and ``nodeagent store verify`` against a store under a fake root."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from nodeagent.adapters.store.blobs import BlobStore
from nodeagent.adapters.store.copier import copy_bundle
from nodeagent.adapters.store.records import StoreRecords
from nodeagent.cli.main import main
from nodeagent.store.layout import BlobRef, registry_record
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle

MIB = 1 << 20


@pytest.fixture(autouse=True)
def default_logging() -> Iterator[None]:
    """The commands route log lines to the stderr pytest captures; put structlog back after."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, Signed]:
    """A root whose store holds bundle ``alpha``, whose set the ledger remembers pinned."""
    root = tmp_path / "root"
    keys = Keys.make(tmp_path / "trusted")
    app = image("example/alpha", [(MIB, 1), (MIB, 2)], tmp_path / "cache")
    bundle = signed_bundle(tmp_path / "alpha", keys, [app], bundle_id="alpha", set_name="line-3")
    state = root / "var/lib/nodeagent"
    copy_bundle(state / "store", bundle.root, bundle.manifest, keys.trusted_dir)
    pinned = {"desiredGeneration": 1, "currentGeneration": 1, "persistent": True,
              "pinnedImages": [str(bundle.manifest.images[0].ref)]}  # fmt: skip
    (state / "ledger.json").write_text(json.dumps({"bootId": "x", "sets": {"line-3": pinned}}))
    return root, bundle


def test_store_shows_what_is_kept_and_why(
    stored: tuple[Path, Signed], capsys: pytest.CaptureFixture[str]
) -> None:
    root, bundle = stored
    assert main(["--root", str(root), "store"]) == 0
    text = capsys.readouterr().out
    assert "bundle alpha (key factory" in text
    assert "kept: set line-3 pinned" in text
    assert "channel default, sequence 1767225600, created 2026-01-01T00:00:00Z" in text
    assert main(["--root", str(root), "store", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (entry,) = doc["bundles"]
    assert entry["sequence"] == bundle.manifest.sequence == 1767225600  # its created, format 1
    assert entry["reasons"][0] == "pinned" and entry["pinnedSets"] == ["line-3"]
    assert doc["storedBytes"] == sum(f.size_bytes for f in bundle.manifest.blobs.values())
    assert entry["ownBytes"] == doc["storedBytes"] and doc["releasableBytes"] == 0


def test_store_verify_reports_and_removes_a_corrupt_blob_and_exits_74(
    stored: tuple[Path, Signed], capsys: pytest.CaptureFixture[str]
) -> None:
    root, bundle = stored
    assert main(["--root", str(root), "store", "verify"]) == 0
    assert "all match their digests" in capsys.readouterr().out
    store = BlobStore(root / "var/lib/nodeagent/store")
    victim = sorted(bundle.manifest.blobs)[0]
    data = bytearray(store.path(victim).read_bytes())
    data[0] ^= 0x20
    store.path(victim).write_bytes(bytes(data))
    assert main(["--root", str(root), "store", "verify", "--json"]) == 74
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["ok"] is False
    assert [c["digest"] for c in doc["corrupt"]] == [victim]
    assert doc["corrupt"][0]["reason"] == "StoreBlobCorrupt"
    assert "StoreBlobCorrupt" in captured.err
    assert victim not in store.stored()
    assert main(["--root", str(root), "store", "verify"]) == 0


def test_text_from_names_is_escaped_on_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    keys = Keys.make(tmp_path / "trusted")
    (keys.trusted_dir / "factory.pub").rename(keys.trusted_dir / "evil\x1b[2J\u202e.pub")
    app = image("example/evil", [(MIB, 3)], tmp_path / "cache")
    bundle = signed_bundle(tmp_path / "evil", keys, [app], bundle_id="evil", set_name="s")
    copy_bundle(root / "var/lib/nodeagent/store", bundle.root, bundle.manifest, keys.trusted_dir)
    assert main(["--root", str(root), "store"]) == 0
    out = capsys.readouterr().out
    assert "evil" in out
    assert "\x1b" not in out and "\u202e" not in out


def test_store_shows_a_registry_set_beside_the_bundles(
    stored: tuple[Path, Signed], capsys: pytest.CaptureFixture[str]
) -> None:
    root, bundle = stored
    store = root / "var/lib/nodeagent/store"
    shared = next(iter(bundle.manifest.blobs.items()))
    ref = BlobRef(shared[0], shared[1].size_bytes)
    StoreRecords(store).write_set(registry_record("web", [], [ref], "2026-11-25T10:00:00Z", 0.0))
    assert main(["--root", str(root), "store"]) == 0
    text = capsys.readouterr().out
    assert "registry set web (fetched 2026-11-25T10:00:00Z): released" in text
    assert "bundle alpha (key factory" in text
    assert main(["--root", str(root), "store", "--json"]) == 0
    entries = {e["bundleId"]: e for e in json.loads(capsys.readouterr().out)["bundles"]}
    assert entries["web"]["source"] == "registry" and entries["alpha"]["source"] == "bundle"
    assert entries["web"]["kept"] is False and entries["web"]["sharedBytes"] == ref.size_bytes
