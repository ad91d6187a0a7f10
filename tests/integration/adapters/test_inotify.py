"""DirectoryWatcher against the real kernel: real directories under tmp_path.

Every wait has a deadline (asyncio.wait_for). Where a test asserts that
nothing is reported, it waits a bounded time for a report that must not come.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from nodeagent.adapters.inotify import DirectoryWatcher, parse_events

DEADLINE_S = 5.0
DEBOUNCE_S = 0.1
QUIET_S = 0.5
"""How long a test waits for a report that must not come (5 x the debounce)."""


async def report(watcher: DirectoryWatcher) -> frozenset[Path]:
    return await asyncio.wait_for(anext(watcher), DEADLINE_S)


async def assert_no_report(watcher: DirectoryWatcher, quiet_s: float = QUIET_S) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(watcher), quiet_s)


def inotify_fds() -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if _link(fd) == "anon_inode:inotify")


def _link(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except OSError:
        return ""


async def test_create_modify_attrib_delete_are_reported(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    async with DirectoryWatcher([d], debounce_s=DEBOUNCE_S) as watcher:
        (d / "a.conf").write_text("one")
        assert await report(watcher) == {d}
        with (d / "a.conf").open("a") as f:
            f.write("two")
        assert await report(watcher) == {d}
        (d / "a.conf").chmod(0o600)
        assert await report(watcher) == {d}
        (d / "a.conf").rename(d / "b.conf")
        assert await report(watcher) == {d}
        (d / "b.conf").unlink()
        assert await report(watcher) == {d}


async def test_only_the_changed_directory_is_reported(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    async with DirectoryWatcher([one, two], debounce_s=DEBOUNCE_S) as watcher:
        (two / "x").write_text("x")
        assert await report(watcher) == {two}
        (one / "y").write_text("y")
        (two / "y").write_text("y")
        assert await report(watcher) == {one, two}


async def test_nothing_is_reported_for_the_state_at_start(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "existing").write_text("x")
    async with DirectoryWatcher([d], debounce_s=DEBOUNCE_S) as watcher:
        await assert_no_report(watcher)


async def test_a_burst_is_one_report(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    async with DirectoryWatcher([d], debounce_s=0.4, max_delay_s=5.0) as watcher:
        for i in range(10):  # writes 50 ms apart for 0.5 s, longer than the debounce
            (d / f"f{i}").write_text(str(i))
            await asyncio.sleep(0.05)
        assert await report(watcher) == {d}
        await assert_no_report(watcher, quiet_s=1.0)


async def test_an_endless_burst_is_reported_after_max_delay(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    stop = asyncio.Event()

    async def keep_writing() -> None:
        i = 0
        while not stop.is_set():
            (d / "busy").write_text(str(i))
            i += 1
            await asyncio.sleep(0.02)

    async with DirectoryWatcher([d], debounce_s=0.2, max_delay_s=0.4) as watcher:
        writer = asyncio.create_task(keep_writing())
        try:  # without max_delay_s this report would never come
            assert await asyncio.wait_for(anext(watcher), 2.0) == {d}
        finally:
            stop.set()
            await writer


async def test_directory_created_later_is_watched(tmp_path: Path) -> None:
    wanted = tmp_path / "run" / "nodeagent" / "pinnedimagesets.d"
    async with DirectoryWatcher([wanted], debounce_s=DEBOUNCE_S) as watcher:
        (tmp_path / "run").mkdir()
        await assert_no_report(watcher)  # an ancestor appearing is not a change of `wanted`
        wanted.mkdir(parents=True)
        assert await report(watcher) == {wanted}
        (wanted / "set.yaml").write_text("x")
        assert await report(watcher) == {wanted}


async def test_nested_wanted_directories(tmp_path: Path) -> None:
    outer = tmp_path / "d"
    inner = outer / "sub"
    outer.mkdir()
    async with DirectoryWatcher([outer, inner], debounce_s=DEBOUNCE_S) as watcher:
        inner.mkdir()  # outer is watched for content and as inner's ancestor at once
        assert await report(watcher) == {outer, inner}
        (inner / "f").write_text("x")
        assert await report(watcher) == {inner}
        (outer / "g").write_text("x")
        assert await report(watcher) == {outer}


async def test_directory_created_with_content_in_one_go(tmp_path: Path) -> None:
    wanted = tmp_path / "a" / "b"
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "b").mkdir()
    (staged / "b" / "file").write_text("x")
    async with DirectoryWatcher([wanted], debounce_s=DEBOUNCE_S) as watcher:
        staged.rename(tmp_path / "a")  # a/b/file appear at once
        assert await report(watcher) == {wanted}
        (wanted / "file").write_text("y")
        assert await report(watcher) == {wanted}


async def test_directory_deleted_and_recreated(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").write_text("x")
    async with DirectoryWatcher([d], debounce_s=DEBOUNCE_S) as watcher:
        shutil.rmtree(d)
        assert await report(watcher) == {d}
        d.mkdir()
        assert await report(watcher) == {d}
        (d / "g").write_text("y")
        assert await report(watcher) == {d}


async def test_directory_moved_away_is_no_longer_followed(tmp_path: Path) -> None:
    d, old = tmp_path / "d", tmp_path / "d.old"
    d.mkdir()
    async with DirectoryWatcher([d], debounce_s=DEBOUNCE_S) as watcher:
        d.rename(old)
        assert await report(watcher) == {d}
        (old / "ignored").write_text("x")
        await assert_no_report(watcher)
        d.mkdir()
        assert await report(watcher) == {d}


async def test_directory_replaced_by_rename_gets_a_fresh_watch(tmp_path: Path) -> None:
    d, new = tmp_path / "d", tmp_path / "new"
    d.mkdir()
    new.mkdir()
    async with DirectoryWatcher([d], debounce_s=DEBOUNCE_S) as watcher:
        new.rename(d)  # replaces the empty d
        assert await report(watcher) == {d}
        (d / "f").write_text("x")
        assert await report(watcher) == {d}


async def test_symlink_entries_are_seen(tmp_path: Path) -> None:
    d, target = tmp_path / "d", tmp_path / "target.conf"
    d.mkdir()
    target.write_text("x")
    async with DirectoryWatcher([d], debounce_s=DEBOUNCE_S) as watcher:
        (d / "link.conf").symlink_to(target)
        assert await report(watcher) == {d}
        (d / "link.conf").unlink()
        assert await report(watcher) == {d}


async def test_subdirectories_only_when_recursive(tmp_path: Path) -> None:
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    async with DirectoryWatcher([d], debounce_s=DEBOUNCE_S) as flat:
        (d / "sub" / "f").write_text("x")
        await assert_no_report(flat)
    async with DirectoryWatcher([d], debounce_s=DEBOUNCE_S, recursive=True) as deep:
        (d / "sub" / "g").write_text("x")
        assert await report(deep) == {d}
        (d / "sub" / "new").mkdir()
        assert await report(deep) == {d}
        (d / "sub" / "new" / "h").write_text("x")
        assert await report(deep) == {d}


async def test_fd_is_closed_on_exit_and_iteration_stops(tmp_path: Path) -> None:
    before = inotify_fds()
    async with DirectoryWatcher([tmp_path], debounce_s=DEBOUNCE_S) as watcher:
        assert inotify_fds() == before + 1
    assert inotify_fds() == before
    with pytest.raises(StopAsyncIteration):
        await anext(watcher)


def test_parse_events_splits_a_buffer() -> None:
    import struct

    name = b"a.conf\0\0"
    buf = struct.pack("iIII", 1, 0x100, 0, len(name)) + name + struct.pack("iIII", 2, 0x8000, 0, 0)
    events = parse_events(buf)
    assert [(e.wd, e.mask, e.name) for e in events] == [(1, 0x100, "a.conf"), (2, 0x8000, "")]
