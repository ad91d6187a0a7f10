"""``nodeagent status`` (issue 28, item 2): a one-line verdict first, the daemon's liveness
checked (a stopped daemon's last "importing" is said to be stale), the same facts on a
terminal as in a pipe, and ``--watch``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.adapters.files import JsonStateStore
from nodeagent.adapters.pins_lock import PINS_LOCK_NAME, PinsLock
from nodeagent.cli import status_view
from nodeagent.config import load_config


def doc(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "updatedAt": "2026-11-28T18:00:00+00:00",
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllPinned", "message": "ok"},
            {"type": "Progressing", "status": "False", "reason": "AsExpected", "message": ""},
            {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": ""},
        ],
        "images": {"pinned": 3, "total": 3, "failed": 0, "present": 3, "pulling": 0},
        "pinnedImageSets": [
            {
                "name": "line-3",
                "state": "Pinned",
                "failedImages": [],
                "desiredGeneration": 1,
                "currentGeneration": 1,
                "images": {"pinned": 3, "total": 3, "failed": 0, "present": 3},
            }
        ],
    }
    return base | extra


def test_all_pinned_working_and_needs_you() -> None:
    assert status_view.verdict(doc(), True).startswith("ALL PINNED: 3/3 images in 1 set(s)")
    degraded = doc(conditions=[
        {"type": "Degraded", "status": "True", "reason": "InsufficientDiskSpace",
         "message": "needs 3 GiB, 1 GiB available"},
    ])  # fmt: skip
    line = status_view.verdict(degraded, True)
    assert line.startswith("NEEDS YOU: InsufficientDiskSpace: needs 3 GiB, 1 GiB available")
    assert "; what to do: " in line
    working = doc(conditions=[
        {"type": "Progressing", "status": "True", "reason": "Pulling", "message": "2 of 5"},
    ])  # fmt: skip
    assert status_view.verdict(working, True) == "WORKING: 2 of 5"


def test_a_stopped_daemons_status_is_said_to_be_stale() -> None:
    line = status_view.verdict(doc(), False)
    assert line.startswith("STALE: the daemon is not running; this status was written at 2026")
    assert "systemctl start nodeagent" in line
    unknown = status_view.verdict(doc(), None)
    assert unknown.endswith("(the daemon could not be checked)")


def test_the_daemon_is_alive_while_someone_holds_the_pin_lock(tmp_path: Path) -> None:
    config = load_config(Path("/etc/nodeagent/config.toml"), root=tmp_path)
    assert status_view.daemon_alive(config) is False
    held = PinsLock(config.state.run_dir / PINS_LOCK_NAME)
    assert held.try_acquire()
    try:
        assert status_view.daemon_alive(config) is True  # another open file: flock refuses
    finally:
        held.release()


def test_watch_prints_a_block_per_change_in_a_pipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(Path("/etc/nodeagent/config.toml"), root=tmp_path)
    store = JsonStateStore(config.state.dir)
    store.save("status", doc())
    monkeypatch.setattr(status_view, "WATCH_EVERY_S", 0.0)
    assert status_view.watch(config, rounds=3) == 0
    out = capsys.readouterr().out
    assert out.count("---- 2026-11-28T18:00:00+00:00") == 1  # unchanged: printed once
    assert "STALE: the daemon is not running" in out
    assert "images: 3/3 pinned" in out
