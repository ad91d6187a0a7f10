"""The pin lock: one holder at a time, freed by release and by the holder's exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.adapters.pins_lock import PinsLock
from nodeagent.errors import HostFileError


def test_one_holder_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "run" / "pins.lock"
    first, second = PinsLock(path), PinsLock(path)
    assert first.try_acquire()
    assert path.stat().st_mode & 0o777 == 0o600
    assert first.holder() == str(os.getpid())
    assert not second.try_acquire()
    first.release()
    assert second.try_acquire() and second.is_held
    second.release()


async def test_acquire_names_the_holder_after_its_deadline(tmp_path: Path) -> None:
    path = tmp_path / "pins.lock"
    holder = PinsLock(path)
    assert holder.try_acquire()
    with pytest.raises(HostFileError, match=rf"held by process {os.getpid()} for longer"):
        await PinsLock(path).acquire(0.3, poll_s=0.05)
    holder.release()
    waiter = PinsLock(path)
    await waiter.acquire(0.3, poll_s=0.05)
    assert waiter.is_held


def test_a_holder_that_exits_frees_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "pins.lock"
    code = (
        "import sys; from pathlib import Path; from nodeagent.adapters.pins_lock import PinsLock;"
        f"assert PinsLock(Path({str(path)!r})).try_acquire(); sys.exit(0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
    assert PinsLock(path).try_acquire()


def test_a_symlink_in_its_place_is_refused(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("x")
    (tmp_path / "pins.lock").symlink_to(tmp_path / "target")
    with pytest.raises(HostFileError, match="cannot open the pin lock"):
        PinsLock(tmp_path / "pins.lock").try_acquire()
