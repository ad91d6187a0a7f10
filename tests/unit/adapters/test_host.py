"""The staging-files probe: its mark changes with the pulls' staging files and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeagent.adapters.host import StagingProbe
from nodeagent.errors import HostFileError


def test_the_mark_follows_staging_files_only(tmp_path: Path) -> None:
    probe = StagingProbe(lambda: [tmp_path, tmp_path / "missing"])
    empty = probe.progress_mark()
    (tmp_path / "busy.log").write_bytes(b"x" * 100)  # another writer on the same filesystem
    (tmp_path / "other-dir").mkdir()
    assert probe.progress_mark() == empty

    staging = tmp_path / "container_images_storage1234"
    staging.mkdir()  # a pull started
    started = probe.progress_mark()
    assert started != empty
    blob = staging / "1"
    blob.write_bytes(b"a" * 10)
    written = probe.progress_mark()
    assert written != started
    (tmp_path / "busy.log").write_bytes(b"y" * 10_000)
    os.utime(blob)  # touched but not grown: no progress
    assert probe.progress_mark() == written
    with blob.open("ab") as file:
        file.write(b"b")
    assert probe.progress_mark() != written


def test_a_top_level_big_file_counts_too(tmp_path: Path) -> None:
    probe = StagingProbe(lambda: [tmp_path])
    before = probe.progress_mark()
    (tmp_path / "container_images_blob999").write_bytes(b"z")
    assert probe.progress_mark() != before


def test_a_staging_directory_that_cannot_be_listed_is_a_host_file_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(HostFileError, match="cannot list staging files"):
        StagingProbe(lambda: [not_a_dir]).progress_mark()
