"""Service test: the CRI-O stand-in keeps the contract of crio_pins_contract.py.

``FakeCrio`` holds the images, ``MemoryConfDir`` the drop-in directory; a reload hands the
files to the fake in CRI-O's reading order. The same assertions run against a real CRI-O in
tests/integration/adapters/cri/test_crio_pins.py: the unit tests that drive nodeagent's pin
path against the stand-in (tests/unit/test_pins.py, test_prepull.py) may rely on what these
assertions pin down, and on nothing else.
"""

from __future__ import annotations

import pytest

from nodeagent.ports import ImageRuntime
from tests.fakes.crio import FakeCrio, MemoryConfDir
from tests.service import crio_pins_contract as contract

HOST = "registry.contract.invalid:5000"
DIGEST_A, DIGEST_B = (f"sha256:{c * 64}" for c in "ab")


class FakePeer:
    def __init__(self) -> None:
        self.crio = FakeCrio()
        self.conf_dir = MemoryConfDir()
        self.crio.start(self.conf_dir.texts_in_crio_order())

    @property
    def runtime(self) -> ImageRuntime:
        return self.crio

    def write_dropin(self, name: str, text: str) -> None:
        self.conf_dir.files[name] = text

    def remove_dropin(self, name: str) -> None:
        del self.conf_dir.files[name]

    async def reload(self) -> None:
        self.crio.reload(self.conf_dir.texts_in_crio_order())

    async def restart(self) -> None:
        self.crio.start(self.conf_dir.texts_in_crio_order())


@pytest.fixture
def peer() -> FakePeer:
    return FakePeer()


@pytest.fixture
def images() -> contract.Images:
    return contract.Images(
        host=HOST,
        a=f"{HOST}/nodeagent-contract/app-a@{DIGEST_A}",
        b=f"{HOST}/nodeagent-contract/app-b@{DIGEST_B}",
        a_copy=f"{HOST}/nodeagent-contract/copy-of-a@{DIGEST_A}",
    )


async def test_version_is_cri_o_1_34(peer: FakePeer) -> None:
    await contract.version_is_cri_o_1_34(peer)


async def test_pulled_by_digest_is_listed_with_its_repo_digest(
    peer: FakePeer, images: contract.Images
) -> None:
    await contract.pulled_by_digest_is_listed_with_its_repo_digest(peer, images)


async def test_one_image_under_two_names_is_one_image(
    peer: FakePeer, images: contract.Images
) -> None:
    await contract.one_image_under_two_names_is_one_image(peer, images)


async def test_upper_case_repository_is_refused(peer: FakePeer, images: contract.Images) -> None:
    await contract.upper_case_repository_is_refused(peer, images)


async def test_image_fs_info_is_the_image_metadata_directory(
    peer: FakePeer, images: contract.Images
) -> None:
    await contract.image_fs_info_is_the_image_metadata_directory(peer, images)


async def test_pins_apply_on_reload_not_on_write(peer: FakePeer, images: contract.Images) -> None:
    await contract.pins_apply_on_reload_not_on_write(peer, images)


async def test_pins_apply_at_start(peer: FakePeer, images: contract.Images) -> None:
    await contract.pins_apply_at_start(peer, images)


async def test_removing_or_emptying_the_list_unpins_on_reload(
    peer: FakePeer, images: contract.Images
) -> None:
    await contract.removing_or_emptying_the_list_unpins_on_reload(peer, images)


async def test_exact_pattern_is_the_whole_name_ignoring_case(
    peer: FakePeer, images: contract.Images
) -> None:
    await contract.exact_pattern_is_the_whole_name_ignoring_case(peer, images)


async def test_a_pattern_for_one_name_pins_the_image_under_all(
    peer: FakePeer, images: contract.Images
) -> None:
    await contract.a_pattern_for_one_name_pins_the_image_under_all(peer, images)


async def test_trailing_star_is_a_prefix_found_anywhere(
    peer: FakePeer, images: contract.Images
) -> None:
    await contract.trailing_star_is_a_prefix_found_anywhere(peer, images)


async def test_star_keyword_star_is_found_anywhere(peer: FakePeer, images: contract.Images) -> None:
    await contract.star_keyword_star_is_found_anywhere(peer, images)


async def test_each_file_setting_the_list_replaces_it(
    peer: FakePeer, images: contract.Images
) -> None:
    await contract.each_file_setting_the_list_replaces_it(peer, images)


async def test_files_are_read_in_bytewise_order_of_their_names(
    peer: FakePeer, images: contract.Images
) -> None:
    await contract.files_are_read_in_bytewise_order_of_their_names(peer, images)
