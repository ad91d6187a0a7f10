"""The CRI adapter against a real CRI-O and a real registry."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nodeagent import errors
from nodeagent.adapters.cri.client import CriClient
from tests.conftest import Pushed
from tests.testenv.crio import Crio

ABSENT_DIGEST = "sha256:" + "0" * 64


async def test_version_reports_cri_o(cri: CriClient) -> None:
    version = await cri.version()
    assert version.runtime_name == "cri-o"
    assert version.runtime_version == "1.34.0"
    assert version.runtime_api_version == "v1"


async def test_pull_by_digest_then_status_and_list(cri: CriClient, pushed: Pushed) -> None:
    ref = pushed.ref(pushed.base_a)
    image_ref = await cri.pull_image(ref)

    status = await cri.image_status(ref)
    assert status is not None
    assert image_ref in (status.id, *status.repo_digests)
    assert ref in status.repo_digests
    image_id = status.id
    assert status.size_bytes > 256 * 1024

    listed = {image.id: image for image in await cri.list_images()}
    assert image_id in listed
    assert ref in listed[image_id].names()


async def test_status_of_absent_image_is_none(cri: CriClient, pushed: Pushed) -> None:
    ref = f"{pushed.host}/nodeagent-test/never-pushed@{ABSENT_DIGEST}"
    assert await cri.image_status(ref) is None


async def test_pull_of_missing_digest_is_not_found(cri: CriClient, pushed: Pushed) -> None:
    ref = f"{pushed.host}/nodeagent-test/app-a@{ABSENT_DIGEST}"
    with pytest.raises(errors.ImageNotFound) as info:
        await cri.pull_image(ref)
    assert info.value.reason == "ImageNotFound"
    assert isinstance(info.value.__cause__, Exception)


async def test_pull_multiarch_index_picks_this_platform(cri: CriClient, pushed: Pushed) -> None:
    ref = pushed.ref(pushed.multiarch)
    await cri.pull_image(ref)
    status = await cri.image_status(ref)
    assert status is not None
    assert ref in status.repo_digests


async def test_remove_image_is_idempotent(cri: CriClient, pushed: Pushed) -> None:
    ref = pushed.ref(pushed.base_b)
    await cri.pull_image(ref)
    assert await cri.image_status(ref) is not None
    await cri.remove_image(ref)
    assert await cri.image_status(ref) is None
    await cri.remove_image(ref)  # absent: no error


async def test_image_fs_info_names_the_storage_mountpoint(cri: CriClient, crio: Crio) -> None:
    filesystems = await cri.image_fs_info()
    assert filesystems
    assert Path(filesystems[0].mountpoint).is_relative_to(crio.storage_root)


async def test_unreachable_socket_fails_fast(tmp_path: Path) -> None:
    started = time.monotonic()
    async with CriClient(f"unix://{tmp_path}/absent.sock", timeout_s=30) as client:
        with pytest.raises(errors.RuntimeUnreachable) as info:
            await client.version()
    # Far below the 30 s deadline: the client does not wait for the socket to appear.
    assert time.monotonic() - started < 5
    assert "absent.sock" in str(info.value)


async def test_pin_dropin_and_reload_make_image_pinned(fresh_crio: Crio, pushed: Pushed) -> None:
    ref = pushed.ref(pushed.base_a)
    async with CriClient(fresh_crio.endpoint) as client:
        await client.pull_image(ref)
        before = await client.image_status(ref)
        assert before is not None
        assert before.is_pinned is False

        (fresh_crio.dropin_dir / "50-test-pins.conf").write_text(
            f'[crio.image]\npinned_images = ["{ref}"]\n'
        )
        fresh_crio.reload()

        after = await client.image_status(ref)
        assert after is not None
        assert after.is_pinned is True
        listed = [image for image in await client.list_images() if image.id == after.id]
        assert [image.is_pinned for image in listed] == [True]

        # Emptying the list unpins again (CRI-O >= 1.31.0).
        (fresh_crio.dropin_dir / "50-test-pins.conf").write_text(
            "[crio.image]\npinned_images = []\n"
        )
        fresh_crio.reload()
        unpinned = await client.image_status(ref)
        assert unpinned is not None
        assert unpinned.is_pinned is False
