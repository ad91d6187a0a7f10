"""The manifest cache on disk: entries round-trip; a damaged entry is set aside and missed."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.registry.cache import ManifestCache
from nodeagent.registries import ImageManifest, Platform

DIGEST = "sha256:" + "a" * 64
AMD64 = Platform("linux", "amd64")


def test_entries_are_read_back_by_another_process(tmp_path: Path) -> None:
    manifest = ImageManifest(100, (("sha256:" + "b" * 64, 5000),))
    ManifestCache(tmp_path).put_image(DIGEST, manifest)
    assert ManifestCache(tmp_path).get(DIGEST, AMD64) == manifest


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b"\xff",
        b"[]",
        b'{"layers": 5, "config_size_bytes": 1}',
        b'{"child": 3}',
        b'{"child": "sha256:../x"}',
        b'{"layers": [], "config_size_bytes": "12"}',  # int("12") was accepted
        b'{"layers": [], "config_size_bytes": -1}',
        b'{"layers": [], "config_size_bytes": 1.5}',
        b'{"layers": [], "config_size_bytes": true}',
        b'{"layers": [["sha256:' + b"b" * 64 + b'", 1, 2]], "config_size_bytes": 1}',
        b'{"layers": [[5, 1]], "config_size_bytes": 1}',
        b'{"layers": [["sha256:' + b"b" * 64 + b'", 9007199254740992]], "config_size_bytes": 1}',
        b'{"layers": [], "config_size_bytes": 1, "layers": []}',
        b'{"layers": [], "config_size_bytes": ' + b"9" * 4301 + b"}",
        b'{"layers": ' + b"[" * 1000 + b"]" * 1000 + b', "config_size_bytes": 1}',
        b"{}",
    ],
)
def test_a_damaged_entry_is_set_aside_logged_and_missed(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / f"{DIGEST.replace(':', '-')}.json"
    path.write_bytes(content)
    with capture_logs() as logs:
        assert ManifestCache(tmp_path).get(DIGEST, AMD64) is None
    [moved] = tmp_path.glob("*.damaged-*")
    assert moved.read_bytes() == content
    assert not path.exists()
    [event] = [e for e in logs if e["event"] == "state_file_damaged"]
    assert (event["reason"], event["moved_to"], event["log_level"]) == (
        "StateFileDamaged",
        str(moved),
        "warning",
    )


def test_a_directory_in_place_of_an_entry_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / f"{DIGEST.replace(':', '-')}.json").mkdir()
    assert ManifestCache(tmp_path).get(DIGEST, AMD64) is None
    assert len(list(tmp_path.glob("*.damaged-*"))) == 1
    manifest = ImageManifest(1, ())
    cache = ManifestCache(tmp_path)
    cache.put_image(DIGEST, manifest)  # written again where the directory was
    assert ManifestCache(tmp_path).get(DIGEST, AMD64) == manifest
