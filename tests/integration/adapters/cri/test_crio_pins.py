"""CRI-O's side of the pin contract (tests/service/crio_pins_contract.py), against the real one.

Each test has a CRI-O of its own (``fresh_crio``: its drop-in directory starts empty and its
reloads touch no other test) and talks to it through nodeagent's CRI client. The images are
pushed to the session registry once: app-a, app-b, and app-a again as copy-of-a.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from nodeagent.adapters.cri.client import CriClient
from nodeagent.ports import ImageRuntime
from tests.service import crio_pins_contract as contract
from tests.testenv.crio import Crio
from tests.testenv.images import LayerSpec, TestImage, push
from tests.testenv.registry import Registry

pytestmark = pytest.mark.integration


class CrioPeer:
    def __init__(self, crio: Crio, client: CriClient) -> None:
        self.crio = crio
        self.client = client

    @property
    def runtime(self) -> ImageRuntime:
        return self.client

    def write_dropin(self, name: str, text: str) -> None:
        (self.crio.dropin_dir / name).write_text(text)

    def remove_dropin(self, name: str) -> None:
        (self.crio.dropin_dir / name).unlink()

    async def reload(self) -> None:
        await asyncio.to_thread(self.crio.reload)

    async def restart(self) -> None:
        await self.client.close()
        await asyncio.to_thread(self.crio.stop)
        await asyncio.to_thread(self.crio.start)
        self.client = CriClient(self.crio.endpoint, timeout_s=60)


@pytest.fixture(scope="module")
def images(registry: Registry) -> contract.Images:
    base = LayerSpec(128 * 1024, seed=81)
    a = TestImage("nodeagent-contract/app-a", [base, LayerSpec(32 * 1024, seed=82)]).build()
    b = TestImage("nodeagent-contract/app-b", [base, LayerSpec(32 * 1024, seed=83)]).build()
    return contract.Images(
        host=registry.host,
        a=push(registry.url, a.repository, a).reference(registry.host),
        b=push(registry.url, b.repository, b).reference(registry.host),
        a_copy=push(registry.url, "nodeagent-contract/copy-of-a", a).reference(registry.host),
    )


@pytest.fixture
async def peer(fresh_crio: Crio) -> AsyncIterator[CrioPeer]:
    crio_peer = CrioPeer(fresh_crio, CriClient(fresh_crio.endpoint, timeout_s=60))
    yield crio_peer
    await crio_peer.client.close()


async def test_version_is_cri_o_1_34(peer: CrioPeer) -> None:
    await contract.version_is_cri_o_1_34(peer)


async def test_pulled_by_digest_is_listed_with_its_repo_digest(
    peer: CrioPeer, images: contract.Images
) -> None:
    await contract.pulled_by_digest_is_listed_with_its_repo_digest(peer, images)


async def test_one_image_under_two_names_is_one_image(
    peer: CrioPeer, images: contract.Images
) -> None:
    await contract.one_image_under_two_names_is_one_image(peer, images)


async def test_upper_case_repository_is_refused(peer: CrioPeer, images: contract.Images) -> None:
    await contract.upper_case_repository_is_refused(peer, images)


async def test_image_fs_info_is_the_image_metadata_directory(
    peer: CrioPeer, images: contract.Images
) -> None:
    await contract.image_fs_info_is_the_image_metadata_directory(peer, images)


async def test_pins_apply_on_reload_not_on_write(peer: CrioPeer, images: contract.Images) -> None:
    await contract.pins_apply_on_reload_not_on_write(peer, images)


async def test_pins_apply_at_start(peer: CrioPeer, images: contract.Images) -> None:
    await contract.pins_apply_at_start(peer, images)


async def test_removing_or_emptying_the_list_unpins_on_reload(
    peer: CrioPeer, images: contract.Images
) -> None:
    await contract.removing_or_emptying_the_list_unpins_on_reload(peer, images)


async def test_exact_pattern_is_the_whole_name_ignoring_case(
    peer: CrioPeer, images: contract.Images
) -> None:
    await contract.exact_pattern_is_the_whole_name_ignoring_case(peer, images)


async def test_a_pattern_for_one_name_pins_the_image_under_all(
    peer: CrioPeer, images: contract.Images
) -> None:
    await contract.a_pattern_for_one_name_pins_the_image_under_all(peer, images)


async def test_trailing_star_is_a_prefix_found_anywhere(
    peer: CrioPeer, images: contract.Images
) -> None:
    await contract.trailing_star_is_a_prefix_found_anywhere(peer, images)


async def test_star_keyword_star_is_found_anywhere(peer: CrioPeer, images: contract.Images) -> None:
    await contract.star_keyword_star_is_found_anywhere(peer, images)


async def test_each_file_setting_the_list_replaces_it(
    peer: CrioPeer, images: contract.Images
) -> None:
    await contract.each_file_setting_the_list_replaces_it(peer, images)


async def test_files_are_read_in_bytewise_order_of_their_names(
    peer: CrioPeer, images: contract.Images
) -> None:
    await contract.files_are_read_in_bytewise_order_of_their_names(peer, images)
