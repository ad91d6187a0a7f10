"""The file adapter on tmp_path: atomic writes, symlinks, CRI-O's drop-in order, space, state."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from nodeagent.adapters.files import (
    DAMAGED_KEPT,
    JsonStateStore,
    ensure_symlink,
    list_files,
    read_text_or_none,
    remove_file,
    set_aside,
    statvfs_free,
    write_atomic,
)
from nodeagent.errors import HostFileError, StateFileDamaged

# ---------------------------------------------------------------- write_atomic


def test_write_creates_parents_and_sets_mode(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "crio" / "crio.conf.d" / "60-nodeagent.conf"
    old_umask = os.umask(0o077)
    try:
        assert write_atomic(path, b"[crio.image]\n", mode=0o644) is True
    finally:
        os.umask(old_umask)
    assert path.read_bytes() == b"[crio.image]\n"
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporaries left


def test_unchanged_write_touches_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_atomic(path, b"same")
    before = path.stat()
    assert write_atomic(path, b"same") is False
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_ctime_ns) == (
        before.st_ino,
        before.st_mtime_ns,
        before.st_ctime_ns,
    )


def test_changed_write_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_atomic(path, b"one")
    before = path.stat()
    with path.open("rb") as reader:  # an open reader keeps the old content
        assert write_atomic(path, b"two", mode=0o600) is True
        assert reader.read() == b"one"
    assert path.read_bytes() == b"two"
    assert path.stat().st_ino != before.st_ino
    assert path.stat().st_mode & 0o777 == 0o600


def test_write_replaces_a_symlink_with_a_file(tmp_path: Path) -> None:
    target, link = tmp_path / "target", tmp_path / "link"
    target.write_bytes(b"target")
    link.symlink_to(target)
    assert write_atomic(link, b"own") is True
    assert not link.is_symlink()
    assert target.read_bytes() == b"target"


def test_write_removes_stale_temporaries_of_the_same_file(tmp_path: Path) -> None:
    (tmp_path / ".f.dead.tmp").write_bytes(b"half")
    (tmp_path / ".other.dead.tmp").write_bytes(b"not ours")
    write_atomic(tmp_path / "f", b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.dead.tmp", "f"]


def test_write_error_names_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(HostFileError, match=r"not-a-dir/f.*writable") as info:
        write_atomic(blocker / "f", b"x")
    assert isinstance(info.value.__cause__, OSError)


# ---------------------------------------------------------------- ensure_symlink


def test_symlink_created_then_left_alone(tmp_path: Path) -> None:
    target, link = tmp_path / "pins.conf", tmp_path / "conf.d" / "60-pins.conf"
    target.write_text("x")
    link.parent.mkdir()
    assert ensure_symlink(link, target) is True
    assert link.readlink() == target
    before = link.lstat()
    assert ensure_symlink(link, target) is False
    assert link.lstat().st_ino == before.st_ino


def test_symlink_retargeted_and_file_replaced(tmp_path: Path) -> None:
    a, b, link = tmp_path / "a", tmp_path / "b", tmp_path / "link"
    a.write_text("a")
    b.write_text("b")
    link.write_text("a regular file in the way")
    assert ensure_symlink(link, a) is True
    assert ensure_symlink(link, b) is True
    assert link.read_text() == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "link"]


def test_relative_symlink_target_resolves_from_the_link_dir(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "pins.conf").write_text("x")
    (tmp_path / "conf.d").mkdir()
    link = tmp_path / "conf.d" / "pins.conf"
    assert ensure_symlink(link, Path("../store/pins.conf")) is True
    assert link.read_text() == "x"


def test_symlink_to_missing_target_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "60-pins.conf"
    with pytest.raises(HostFileError, match=r"does not exist.*create the target first"):
        ensure_symlink(link, tmp_path / "absent")
    assert not link.is_symlink()


def test_symlink_over_a_directory_fails(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("x")
    (tmp_path / "dir").mkdir()
    with pytest.raises(HostFileError, match="not a directory"):
        ensure_symlink(tmp_path / "dir", tmp_path / "target")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "target"]


# ---------------------------------------------------------------- remove, read


def test_remove_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    assert remove_file(path) is True
    assert remove_file(path) is False
    assert not path.exists()


def test_read_text_or_none(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("héllo")
    (tmp_path / "dangling").symlink_to(tmp_path / "absent")
    (tmp_path / "latin1").write_bytes(b"\xe9")
    assert read_text_or_none(tmp_path / "f") == "héllo"
    assert read_text_or_none(tmp_path / "absent") is None
    assert read_text_or_none(tmp_path / "dangling") is None
    with pytest.raises(HostFileError, match="not UTF-8"):
        read_text_or_none(tmp_path / "latin1")
    with pytest.raises(HostFileError, match="Is a directory"):
        read_text_or_none(tmp_path)


# ---------------------------------------------------------------- list_files

DROPINS = ["b.conf", "a.conf", "a-b", "10-z", "9-a", "A", "_x", ".hidden", "a/x", "a/sub/y"]


@pytest.fixture
def dropin_dir(tmp_path: Path) -> Path:
    root = tmp_path / "crio.conf.d"
    for name in DROPINS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    (root / "empty-dir").mkdir()
    return root


@pytest.mark.parametrize(
    ("recursive", "expected"),
    [
        # Bytewise by name per level, descending into "a" at its place (before "a-b", "a.conf").
        (True, [".hidden", "10-z", "9-a", "A", "_x", "a/sub/y", "a/x", "a-b", "a.conf", "b.conf"]),
        (False, [".hidden", "10-z", "9-a", "A", "_x", "a-b", "a.conf", "b.conf"]),
    ],
)
def test_list_files_in_crio_walk_order(
    dropin_dir: Path, recursive: bool, expected: list[str]
) -> None:
    listed = list_files(dropin_dir, recursive=recursive)
    assert [p.relative_to(dropin_dir).as_posix() for p in listed] == expected


def test_list_files_lists_symlinks_whatever_they_point_to(tmp_path: Path) -> None:
    root = tmp_path / "conf.d"
    root.mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "inside").write_text("x")
    (root / "1-file").symlink_to(tmp_path / "file")
    (root / "2-dir").symlink_to(tmp_path / "dir")
    (root / "3-dangling").symlink_to(tmp_path / "absent")
    names = [p.name for p in list_files(root, recursive=True)]
    assert names == ["1-file", "2-dir", "3-dangling"]  # CRI-O reads all three; 2 and 3 fail it


def test_list_files_of_missing_dir_is_empty(tmp_path: Path) -> None:
    assert list_files(tmp_path / "absent", recursive=True) == []


def test_list_files_of_a_file_fails(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(HostFileError, match="readable directory"):
        list_files(tmp_path / "f", recursive=False)


# ---------------------------------------------------------------- statvfs


def test_statvfs_free(tmp_path: Path) -> None:
    before = os.statvfs(tmp_path)
    figures = statvfs_free(tmp_path)
    after = os.statvfs(tmp_path)
    assert figures.total_bytes == after.f_blocks * after.f_frsize
    assert 0 <= figures.available_bytes <= figures.free_bytes <= figures.total_bytes
    # Other processes write to this filesystem meanwhile: the figure lies between two samples.
    samples = [raw.f_bavail * raw.f_frsize for raw in (before, after)]
    assert min(samples) <= figures.available_bytes <= max(samples)


def test_statvfs_of_missing_path_fails(tmp_path: Path) -> None:
    with pytest.raises(HostFileError, match="absent"):
        statvfs_free(tmp_path / "absent")


# ---------------------------------------------------------------- JsonStateStore


def test_state_round_trip_is_canonical_and_private(tmp_path: Path) -> None:
    store = JsonStateStore(tmp_path / "state")
    assert store.load("sync") is None
    assert store.save("sync", {"b": [1, 2], "a": "ä"}) is True
    path = tmp_path / "state" / "sync.json"
    assert path.read_text() == '{\n  "a": "ä",\n  "b": [\n    1,\n    2\n  ]\n}\n'
    assert path.stat().st_mode & 0o777 == 0o600
    assert store.load("sync") == {"a": "ä", "b": [1, 2]}
    assert store.save("sync", {"a": "ä", "b": [1, 2]}) is False


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"{", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[]", "not an object"),
        (b'"x"', "holds a str"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[" * 100_000, "nested 100000 deep, more than 32"),
        # Strict JSON (issue 13): what json.loads took, and crashes or misreads later.
        (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b'{"a": Infinity}', "Infinity is not a JSON number"),
        (b'{"a": 1e999}', "out of range"),
        (b'{"a": ' + b"9" * 400 + b"}", "an integer of 400 digits"),
        (b'{"a": "q\\ud800"}', "lone surrogate"),
        (b"\xef\xbb\xbf{}", "byte-order mark"),
        (b'{"a": "\x00"}', "NUL"),
    ],
)
def test_damaged_state_is_state_file_damaged_and_says_what_happens(
    tmp_path: Path, content: bytes, match: str
) -> None:
    (tmp_path / "sync.json").write_bytes(content)
    with pytest.raises(StateFileDamaged, match=f"({match}).*sets it aside and rebuilds"):
        JsonStateStore(tmp_path).load("sync")


def test_a_directory_in_place_of_a_state_file_is_damaged(tmp_path: Path) -> None:
    (tmp_path / "sync.json").mkdir()
    with pytest.raises(StateFileDamaged, match="is a directory"):
        JsonStateStore(tmp_path).load("sync")


def test_set_aside_keeps_the_damaged_file_beside_it_under_a_new_name(tmp_path: Path) -> None:
    store = JsonStateStore(tmp_path)
    (tmp_path / "sync.json").write_bytes(b"{")
    moved = store.set_aside("sync")
    assert moved is not None
    assert Path(moved).parent == tmp_path
    assert Path(moved).name.startswith("sync.json.damaged-")
    assert Path(moved).read_bytes() == b"{"
    assert store.load("sync") is None
    assert store.set_aside("sync") is None  # nothing left to move


def test_set_aside_moves_a_directory_and_keeps_only_the_newest_copies(tmp_path: Path) -> None:
    path = tmp_path / "sync.json"
    moved = []
    for round_ in range(DAMAGED_KEPT + 2):
        path.mkdir()
        (path / "inside").write_text(str(round_))
        at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=round_)
        found = set_aside(path, now=at)
        assert found is not None
        moved.append(found)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(p.name for p in moved[-DAMAGED_KEPT:])
    assert (moved[-1] / "inside").read_text() == str(DAMAGED_KEPT + 1)


def test_set_aside_twice_in_the_same_second_keeps_both(tmp_path: Path) -> None:
    path = tmp_path / "sync.json"
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    path.write_text("1")
    first = set_aside(path, now=at)
    path.write_text("2")
    second = set_aside(path, now=at)
    assert first is not None and second is not None
    assert (first.read_text(), second.read_text()) == ("1", "2")


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "../up"])
def test_state_names_are_plain_file_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="invalid state name"):
        JsonStateStore(tmp_path).save(name, {})
