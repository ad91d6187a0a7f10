"""Where a bundle's PinnedImageSets are written: inside the spec directory, or nowhere (R26)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.adapters.bundles.intake import SpecDirs
from nodeagent.bundles.handover import set_file_name
from nodeagent.errors import BundleUnsafePath


@pytest.fixture
def dirs(tmp_path: Path) -> SpecDirs:
    for name in ("etc", "run"):
        (tmp_path / name).mkdir()
    return SpecDirs(tmp_path / "etc", tmp_path / "run")


def test_R26_sets_go_to_their_directory(dirs: SpecDirs) -> None:
    path = dirs.write_set("bundle-b-apps.yaml", "x: 1\n", is_persistent=True)
    assert path == dirs.persistent_dir / "bundle-b-apps.yaml"
    assert path.read_text() == "x: 1\n"
    assert dirs.write_set("t.yaml", "", is_persistent=False).parent == dirs.transient_dir


@pytest.mark.parametrize("name", ["../outside.yaml", "x/../../outside.yaml", "..", "a" * 256])
def test_R26_a_name_that_would_leave_the_directory_is_refused(dirs: SpecDirs, name: str) -> None:
    with pytest.raises(BundleUnsafePath):
        dirs.write_set(name, "x", is_persistent=True)
    assert sorted(p.name for p in dirs.persistent_dir.parent.rglob("*")) == ["etc", "run"]


def test_R26_a_symbolic_link_out_of_the_directory_is_not_written_through(
    dirs: SpecDirs, tmp_path: Path
) -> None:
    (dirs.persistent_dir / "s.yaml").symlink_to(tmp_path / "outside.yaml")
    with pytest.raises(BundleUnsafePath, match="outside the spec directory"):
        dirs.write_set("s.yaml", "x", is_persistent=True)
    assert not (tmp_path / "outside.yaml").exists()


def test_R26_set_file_names_fit_a_file_system(dirs: SpecDirs) -> None:
    assert set_file_name("line-3", "apps") == "bundle-line-3-apps.yaml"
    longest = set_file_name("b" * 128, "s" * 253)
    assert len(longest) == len("bundle-.yaml") + 200
    assert longest.startswith("bundle-" + "b" * 128 + "-" + "s" * 54 + "-")
    assert longest != set_file_name("b" * 128, "s" * 252 + "t")
    # written for real: the file and its atomic write's temporary name fit NAME_MAX
    assert dirs.write_set(longest, "x: 1\n", is_persistent=True).name == longest
