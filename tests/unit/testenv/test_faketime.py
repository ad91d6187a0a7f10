"""What the clock drill's ``FakeClock`` leaves and removes (tests/testenv/faketime.py)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.testenv.faketime import FakeClock, left_behind

GONE = 4_194_305
"""A pid no process can have (above the kernel's largest ``pid_max``, 2^22)."""


def test_only_the_files_of_ended_processes_are_left_behind(tmp_path: Path) -> None:
    names = [f"faketime_shm_{GONE}", f"sem.faketime_sem_{GONE}", f"faketime_shm_{os.getpid()}",
             f"sem.faketime_sem_{os.getpid()}", f"other_{GONE}", "faketime_shm_x"]  # fmt: skip
    for name in names:
        (tmp_path / name).touch()
    assert left_behind(tmp_path) == {tmp_path / names[0], tmp_path / names[1]}


def test_steps_are_written_whole_as_offsets(tmp_path: Path) -> None:
    clock = FakeClock(tmp_path / "clock", 3600)
    assert clock.path.read_text() == "+3600\n"
    clock.step(-7200)
    assert (clock.offset_s, clock.path.read_text()) == (-3600, "-3600\n")
    assert [p.name for p in tmp_path.iterdir()] == ["clock"]
