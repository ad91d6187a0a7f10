"""tests/testenv/blkio.py on a fake cgroupfs: the v2 path (``io.max``) that this machine
kind (cgroup v1) cannot run for real, and the choice between the versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.testenv import blkio

PID = 4242


def fake_v2(tmp_path: Path, *, subtree: str = "") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    (root / "user.slice" / "session-1.scope").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text(subtree)
    (root / "user.slice" / "session-1.scope" / "cgroup.procs").write_text("")
    proc = tmp_path / "proc"
    (proc / str(PID)).mkdir(parents=True)
    (proc / str(PID) / "cgroup").write_text("0::/user.slice/session-1.scope\n")
    return root, proc


def test_v2_moves_the_process_into_a_group_with_io_max_and_back(tmp_path: Path) -> None:
    root, proc = fake_v2(tmp_path, subtree="cpu memory\n")
    assert blkio.version(root) == 2
    assert blkio.missing(root) is None
    with blkio.throttled_reads(PID, "/dev/loop7", 16_000_000, root=root, device="7:7", proc=proc):
        (group,) = [p for p in root.iterdir() if p.name.startswith("nodeagent-test-")]
        assert (group / "io.max").read_text() == "7:7 rbps=16000000\n"
        assert (group / "cgroup.procs").read_text() == f"{PID}\n"
        assert (root / "cgroup.subtree_control").read_text() == "+io\n"
        for made in group.iterdir():  # the kernel's files vanish with the group
            made.unlink()
    assert not group.exists()
    back = root / "user.slice" / "session-1.scope" / "cgroup.procs"
    assert back.read_text() == f"{PID}\n"


def test_v2_leaves_an_enabled_io_controller_alone(tmp_path: Path) -> None:
    root, proc = fake_v2(tmp_path, subtree="cpu io memory\n")
    with blkio.throttled_reads(PID, "/dev/loop7", 1, root=root, device="7:7", proc=proc):
        for made in next(root.glob("nodeagent-test-*")).iterdir():
            made.unlink()
    assert (root / "cgroup.subtree_control").read_text() == "cpu io memory\n"


def test_v1_is_chosen_where_blkio_is_mounted(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "blkio").mkdir(parents=True)
    (root / "blkio" / "cgroup.procs").write_text("")
    assert blkio.version(root) == 1
    with blkio.throttled_reads(PID, "/dev/loop7", 5, root=root, device="7:7"):
        group = next((root / "blkio").glob("nodeagent-test-*"))
        assert (group / "blkio.throttle.read_bps_device").read_text() == "7:7 5\n"
        for made in group.iterdir():
            made.unlink()
    assert (root / "blkio" / "cgroup.procs").read_text() == f"{PID}\n"


def test_neither_is_named_as_missing(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")  # v2 without io
    assert blkio.version(tmp_path) is None
    assert "no cgroup v1 blkio controller" in (blkio.missing(tmp_path) or "")
    with (
        pytest.raises(RuntimeError, match="no cgroup v2 io"),
        blkio.throttled_reads(PID, "/dev/x", 1, root=tmp_path, device="1:1"),
    ):
        pass
