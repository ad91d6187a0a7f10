"""tools/build_image.py's reproducible parts, cheaply (the full twice-build from empty
caches is ``make image-twice``): a layer's bytes depend only on the tree's names, contents,
modes and links, never on creation order, times past the clamp, or the build's clock."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path

from tests.unit.container import build_image

ROOT = Path(__file__).resolve().parents[3]


EPOCH = 1_700_000_000


def make_tree(root: Path, *, reverse: bool, mtime: int) -> Path:
    names = ["usr/bin/tool", "usr/lib/a.py", "etc/conf", "usr/lib/b/c.txt"]
    for name in reversed(names) if reverse else names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"content of {name}\n")
    (root / "usr/bin/tool").chmod(0o755)
    (root / "usr/bin/link").symlink_to("tool")
    os.link(root / "etc/conf", root / "etc/conf.hard")
    for path in [*root.rglob("*")]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)
    return root


def test_a_tree_made_twice_in_another_order_and_time_gives_the_same_layer(tmp_path: Path) -> None:
    first = build_image.make_layer(
        make_tree(tmp_path / "a", reverse=False, mtime=EPOCH + 99), EPOCH
    )
    second = build_image.make_layer(make_tree(tmp_path / "b", reverse=True, mtime=EPOCH + 7), EPOCH)
    assert first.blob == second.blob
    assert first.diff_id == second.diff_id
    older = build_image.make_layer(make_tree(tmp_path / "c", reverse=False, mtime=EPOCH - 5), EPOCH)
    assert older.blob != first.blob  # times before the clamp are kept: the test can fail


def test_layer_entries_are_sorted_clamped_numeric_and_links_kept(tmp_path: Path) -> None:
    layer = build_image.make_layer(make_tree(tmp_path / "a", reverse=True, mtime=EPOCH + 1), EPOCH)
    assert layer.blob[4:8] == b"\0\0\0\0"  # gzip MTIME
    assert not layer.blob[3] & 0x08  # no FNAME
    raw = gzip.decompress(layer.blob)
    assert build_image.sha256(raw) == layer.diff_id
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names.index("etc") < names.index("etc/conf") < names.index("usr")
    assert all(m.mtime == EPOCH and m.uname == "" and m.gname == "" for m in members)
    by_name = {m.name: m for m in members}
    assert by_name["usr/bin/link"].issym() and by_name["usr/bin/link"].linkname == "tool"
    assert by_name["etc/conf.hard"].islnk() and by_name["etc/conf.hard"].linkname == "etc/conf"
    assert by_name["usr/bin/tool"].mode & 0o777 == 0o755


def test_the_layout_is_the_same_twice_and_names_the_image(tmp_path: Path) -> None:
    layer = build_image.make_layer(make_tree(tmp_path / "t", reverse=False, mtime=EPOCH), EPOCH)
    config = build_image.canonical_json(build_image.image_config([layer], EPOCH, "9.9.9"))
    one = build_image.write_layout(tmp_path / "one", [layer], config, "9.9.9")
    two = build_image.write_layout(tmp_path / "two", [layer], config, "9.9.9")
    assert one == two
    assert (tmp_path / "one/index.json").read_bytes() == (tmp_path / "two/index.json").read_bytes()
    index = json.loads((tmp_path / "one/index.json").read_text())
    (entry,) = index["manifests"]
    assert entry["digest"] == one
    assert entry["annotations"][build_image.REF_NAME] == "localhost/nodeagent:9.9.9"
    blob = tmp_path / "one/blobs/sha256" / one.removeprefix("sha256:")
    assert build_image.sha256(blob.read_bytes()) == one
    build_image.write_archive(tmp_path / "one", tmp_path / "a.tar", EPOCH)
    build_image.write_archive(tmp_path / "two", tmp_path / "b.tar", EPOCH)
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


def test_the_config_is_dated_by_the_epoch_and_runs_the_daemon() -> None:
    config = build_image.image_config([], EPOCH, "1.0")
    assert config["created"] == "2023-11-14T22:13:20Z"
    inner = config["config"]
    assert isinstance(inner, dict)
    assert inner["Entrypoint"] == ["/usr/bin/nodeagent"] and inner["Cmd"] == ["run"]
    assert "PYTHONDONTWRITEBYTECODE=1" in inner["Env"]
