"""What a node has accepted, read from the signed manifests in its store
(``nodeagent.adapters.store.accepted``): only what verifies against the trusted keys now."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from nodeagent.adapters.store.accepted import accepted_stamps
from nodeagent.bundles import minisign
from nodeagent.bundles.freshness import Stamp
from nodeagent.store import layout
from tests.unit.bundles.test_manifest import manifest_doc


def keypair(directory: Path, name: str) -> minisign.SecretKey:
    public, secret = minisign.generate_keypair(comment=name)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.pub").write_text(public)
    return minisign.parse_secret_key(secret)


def put(store: Path, directory: str, key: minisign.SecretKey, **changes: Any) -> tuple[bytes, Path]:
    data = json.dumps(manifest_doc(bundleId=directory, **changes)).encode()
    where = store / layout.bundle_dir(directory)
    where.mkdir(parents=True)
    (where / layout.MANIFEST_NAME).write_bytes(data)
    (where / layout.SIGNATURE_NAME).write_text(minisign.sign(data, key, trusted_comment="t"))
    return data, where


def test_every_signed_manifest_that_verifies_now_and_only_those(tmp_path: Path) -> None:
    trusted, store = tmp_path / "trusted", tmp_path / "store"
    key = keypair(trusted, "factory")
    gone = keypair(tmp_path / "removed", "old-factory")  # no longer in trusted-keys.d
    release, _ = put(store, "r5", key, formatVersion=3, sequence=5, channel="release")
    legacy, _ = put(store, "v1", key)  # format 1: its created time in seconds
    put(store, "gone", gone, formatVersion=3, sequence=99)
    _, swapped = put(store, "swapped", key, formatVersion=3, sequence=98)
    (swapped / layout.MANIFEST_NAME).write_bytes(b'{"formatVersion": 3}')  # signature broken
    _, moved = put(store, "elsewhere", key, formatVersion=3, sequence=97)
    (moved.parent / "renamed").mkdir()
    for name in (layout.MANIFEST_NAME, layout.SIGNATURE_NAME):
        (moved / name).rename(moved.parent / "renamed" / name)  # names bundle "elsewhere"
    _, linked = put(store, "linked", key, formatVersion=3, sequence=96)
    data = (linked / layout.MANIFEST_NAME).read_bytes()
    (linked / layout.MANIFEST_NAME).unlink()
    (tmp_path / "outside.json").write_bytes(data)
    (linked / layout.MANIFEST_NAME).symlink_to(tmp_path / "outside.json")  # never followed
    (store / layout.bundle_dir("unfinished")).mkdir()  # a copy that wrote nothing yet

    found = sorted(accepted_stamps(store, trusted), key=lambda s: s.bundle_id)

    key_id = key.public_key().key_id_hex
    assert found == [
        Stamp(key_id, "release", 5, f"sha256:{hashlib.sha256(release).hexdigest()}", "r5"),
        Stamp(key_id, "default", 1795339800, f"sha256:{hashlib.sha256(legacy).hexdigest()}",
              "v1"),
    ]  # fmt: skip


def test_a_store_without_bundles_has_accepted_nothing(tmp_path: Path) -> None:
    assert accepted_stamps(tmp_path / "store", tmp_path / "trusted") == ()
