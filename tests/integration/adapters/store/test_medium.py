"""copy_bundle from a real medium: an ext4 image on a loop device, mounted as the daemon does.

The bytes the copy reads from the medium's block device are counted by the kernel
(``/sys/block/loopN/stat``, sectors read): the stick is read once, and a second copy of the
same bundle reads none of its blobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.adapters.bundles.mount import mount_readonly, unmount
from nodeagent.adapters.store import keeper
from nodeagent.adapters.store.copier import copy_bundle
from tests.testenv.bundles import ext4_media
from tests.testenv.signed_bundles import Keys, Signed, image, signed_bundle

pytestmark = [
    pytest.mark.integration,
    pytest.mark.needs("root"),
]

MIB = 1 << 20


def sectors_read(devnode: str) -> int:
    return int(Path(f"/sys/block/{Path(devnode).name}/stat").read_text().split()[2])


@pytest.fixture
def medium(tmp_path: Path) -> Iterator[tuple[Signed, Keys, str, Path]]:
    """A signed 24 MiB bundle on an ext4 loop device, mounted read-only; all undone."""
    keys = Keys.make(tmp_path / "trusted")
    app = image("example/medium", [(8 * MIB, 31), (16 * MIB, 32)], tmp_path / "cache")
    bundle = signed_bundle(tmp_path / "bundle", keys, [app], bundle_id="stick", set_name="s")
    with ext4_media(tmp_path, bundle.root, label="NASTORETEST") as media:
        devnode = media.attach()
        mounted = mount_readonly(devnode, "ext4", tmp_path / "mnt")
        try:
            yield bundle, keys, devnode, mounted.target
        finally:
            unmount(mounted.target)


def test_the_medium_is_read_once(medium: tuple[Signed, Keys, str, Path], tmp_path: Path) -> None:
    bundle, keys, devnode, mountpoint = medium
    bundle_bytes = sum(p.stat().st_size for p in mountpoint.rglob("*") if p.is_file())
    store = tmp_path / "store"
    before = sectors_read(devnode)
    result = copy_bundle(store, mountpoint, bundle.manifest, keys.trusted_dir)
    read_bytes = (sectors_read(devnode) - before) * 512
    assert (
        result.bytes_read
        == result.bytes_copied
        == bundle.manifest.total_size_bytes
        - sum(f.size_bytes for f in bundle.manifest.files if not f.path.startswith("blobs/"))
    )
    assert result.bytes_copied <= read_bytes <= 1.01 * bundle_bytes
    assert keeper.verify(store).is_ok
    before = sectors_read(devnode)
    again = copy_bundle(store, mountpoint, bundle.manifest, keys.trusted_dir)
    assert again.bytes_read == 0
    assert (sectors_read(devnode) - before) * 512 < MIB  # bundle.json and its signature only
