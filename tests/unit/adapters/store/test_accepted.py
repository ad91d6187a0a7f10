"""What a node has accepted, read from the signed manifests in its store
(``nodeagent.adapters.store.accepted``): only what verifies against the trusted keys now."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.store import accepted
from nodeagent.adapters.store.accepted import accepted_stamps
from nodeagent.bundles import minisign
from nodeagent.bundles.freshness import Stamp
from nodeagent.bundles.rollback_marks import marks_from_json
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
              "v1", format_version=1),
    ]  # fmt: skip


def test_a_store_without_bundles_has_accepted_nothing(tmp_path: Path) -> None:
    assert accepted_stamps(tmp_path / "store", tmp_path / "trusted") == ()


@pytest.fixture(autouse=True)
def fresh_reports() -> None:
    accepted._REPORTED.clear()  # once per daemon: each test is a new daemon


def test_a_manifest_that_stops_verifying_keeps_its_mark_and_is_reported_once(
    tmp_path: Path,
) -> None:
    trusted, store = tmp_path / "trusted", tmp_path / "store"
    old, new = keypair(trusted, "old"), keypair(trusted, "new")
    put(store, "old-9", old, formatVersion=3, sequence=9)
    put(store, "new-1", new, formatVersion=3, sequence=1, supersedes=[old.public_key().key_id_hex])
    before = accepted_stamps(store, trusted)
    assert {s.bundle_id for s in before} == {"old-9", "new-1"}
    (trusted / "old.pub").unlink()  # the old key retired after the rotation

    with capture_logs() as logs:
        after = accepted_stamps(store, trusted)
        again = accepted_stamps(store, trusted)

    assert after == again == before, "the retired key's mark did not drop out"
    [warning] = [e for e in logs if e["event"] == "bundle_manifest_unverified"]
    assert (warning["log_level"], warning["bundle"], warning["is_mark_kept"]) == (
        "warning", "old-9", True
    )  # fmt: skip
    assert warning["reason"] == "BundleSignedByUnknownKey"


def test_a_manifest_never_recorded_that_does_not_verify_is_reported_as_markless(
    tmp_path: Path,
) -> None:
    trusted, store = tmp_path / "trusted", tmp_path / "store"
    gone = keypair(tmp_path / "removed", "gone")
    put(store, "gone", gone, formatVersion=3, sequence=99)
    keypair(trusted, "factory")
    with capture_logs() as logs:
        assert accepted_stamps(store, trusted) == ()
    [warning] = [e for e in logs if e["event"] == "bundle_manifest_unverified"]
    assert warning["is_mark_kept"] is False and "held no recorded mark" in warning["error"]


@pytest.mark.parametrize(
    "damage",
    [b"{", b'{"version": 1, "stamps": [{"keyId": "zz"}]}', b"[]", b'{"version": 9}', None],
    ids=["truncated", "bad-stamp", "not-an-object", "unknown-version", "a-directory"],
)
def test_a_damaged_marks_file_is_set_aside_and_rebuilt(
    tmp_path: Path, damage: bytes | None
) -> None:
    trusted, store = tmp_path / "trusted", tmp_path / "store"
    key = keypair(trusted, "factory")
    put(store, "r5", key, formatVersion=3, sequence=5)
    marks = store / layout.ROLLBACK_MARKS_NAME
    if damage is None:
        marks.mkdir(parents=True)
    else:
        marks.write_bytes(damage)

    with capture_logs() as logs:
        found = accepted_stamps(store, trusted)

    assert [s.bundle_id for s in found] == ["r5"]
    [warning] = [e for e in logs if e["event"] == "state_file_damaged"]
    assert warning["moved_to"] is not None and Path(warning["moved_to"]).exists()
    rebuilt = marks_from_json(marks.read_bytes(), where="test")
    assert [s.bundle_id for s in rebuilt] == ["r5"]


def test_the_marks_file_is_written_once_and_only_rewritten_when_marks_change(
    tmp_path: Path,
) -> None:
    trusted, store = tmp_path / "trusted", tmp_path / "store"
    key = keypair(trusted, "factory")
    put(store, "r5", key, formatVersion=3, sequence=5)
    accepted_stamps(store, trusted)
    marks = store / layout.ROLLBACK_MARKS_NAME
    first = marks.stat()
    accepted_stamps(store, trusted)
    assert marks.stat().st_ino == first.st_ino, "unchanged bytes are not rewritten"
    put(store, "r6", key, formatVersion=3, sequence=6)
    accepted_stamps(store, trusted)
    assert [s.sequence for s in marks_from_json(marks.read_bytes(), where="t")] == [6]
