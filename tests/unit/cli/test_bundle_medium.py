"""``bundle import DEVICE | LABEL=NAME``: what names a stick, and an unmount that fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.cli import bundle_medium
from nodeagent.errors import MediaMountFailed, MediaUnmountFailed


def test_a_label_is_resolved_through_udevs_by_label_links(tmp_path: Path) -> None:
    device = tmp_path / "sdb1"
    device.write_text("")
    (tmp_path / "NODEAGENT1").symlink_to(device)
    assert bundle_medium.device_of("LABEL=NODEAGENT1", by_label=tmp_path) == str(device)
    with pytest.raises(MediaMountFailed, match="labels match case"):
        bundle_medium.device_of("LABEL=nodeagent1", by_label=tmp_path)


@pytest.mark.parametrize("label", ["", "a/b", "../x", "..", ".", "x" * 65, "a b", "é"])
def test_a_label_that_could_leave_the_directory_is_refused(tmp_path: Path, label: str) -> None:
    with pytest.raises(MediaMountFailed, match="a label is 1 to 64"):
        bundle_medium.device_of(f"LABEL={label}", by_label=tmp_path)


def test_a_directory_or_a_missing_path_is_no_device(tmp_path: Path) -> None:
    assert bundle_medium.device_of(str(tmp_path)) is None
    assert bundle_medium.device_of(str(tmp_path / "none")) is None


def test_an_unmount_that_fails_is_detached_lazily_and_said() -> None:
    calls: list[bool] = []

    def unmount(target: Path, *, lazy: bool = False) -> None:
        calls.append(lazy)
        if not lazy:
            raise MediaUnmountFailed(f"cannot unmount {target}: Device or resource busy")

    failed = bundle_medium._unmount(Path("/m"), unmount)
    assert calls == [False, True]
    assert failed is not None and "detached lazily" in failed.message
    assert bundle_medium._unmount(Path("/m"), lambda _t, **_k: None) is None
