"""What nodeagent may expect of CRI-O's image service: one set of assertions, two peers.

tests/service/test_crio_pins.py runs them against the stand-in (``FakeCrio`` and
``MemoryConfDir`` of tests/fakes/crio.py, in memory); tests/integration/adapters/cri/
test_crio_pins.py runs the same functions against a real CRI-O 1.34.0 (tests/testenv/crio.py)
through nodeagent's CRI client, with files in its drop-in directory and SIGHUP.

What the real one showed and the stand-in now mirrors: ``pinned_images`` is read at start
and on reload only, never on a mere write; patterns match every name of an image (exact and
whole-name, ``prefix*`` anywhere in a name, ``*keyword*`` anywhere, all ignoring case); the
drop-in files are read in bytewise order of their names (Go's ``filepath.Walk``), and each
file that sets the key replaces the list; one image pulled under two names is one image with
both repo digests, and removing it by one name only drops that name; a reference whose
repository has upper-case letters is refused, not looked up; ImageFsInfo is the usage of the
``<driver>-images`` metadata directory, never zero. A lone ``*`` pattern is never sent: CRI-O
1.34.0 panics on it (nodeagent.pins.CRASHING_PATTERNS).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol

import pytest

from nodeagent import errors
from nodeagent.ports import ImageRuntime, RuntimeVersion

VERSION = RuntimeVersion("cri-o", "1.34.0", "v1")
DROPIN = "50-contract.conf"


class Peer(Protocol):
    """A CRI-O, real or stand-in, whose drop-in directory the test owns (empty at first)."""

    @property
    def runtime(self) -> ImageRuntime: ...

    def write_dropin(self, name: str, text: str) -> None: ...

    def remove_dropin(self, name: str) -> None: ...

    async def reload(self) -> None:
        """SIGHUP, returning once the runtime has re-read its files."""

    async def restart(self) -> None:
        """Stop and start the runtime: it reads its files as it starts."""


@dataclass(frozen=True)
class Images:
    """Digest references the peer can pull: ``a``, ``b`` and ``a`` under a second name."""

    host: str
    a: str
    """``<host>/nodeagent-contract/app-a@sha256:…``"""
    b: str
    """``<host>/nodeagent-contract/app-b@sha256:…``, another image."""
    a_copy: str
    """``<host>/nodeagent-contract/copy-of-a@<a's digest>``: image ``a`` under another name."""


def pins(*patterns: str) -> str:
    assert "*" not in patterns, "a lone '*' makes CRI-O 1.34.0 panic"
    quoted = ", ".join(f'"{p}"' for p in patterns)
    return f"[crio.image]\npinned_images = [{quoted}]\n"


async def pinned(peer: Peer, *refs: str) -> list[bool]:
    """Each image's ``pinned`` as ImageStatus and ListImages report it (they must agree)."""
    flags = []
    listed = {image.id: image for image in await peer.runtime.list_images()}
    for ref in refs:
        status = await peer.runtime.image_status(ref)
        assert status is not None, f"{ref} is not in the store"
        assert listed[status.id].is_pinned == status.is_pinned
        flags.append(status.is_pinned)
    return flags


async def pin_with(peer: Peer, images: Images, *patterns: str) -> list[bool]:
    """Pin ``patterns`` in one drop-in, reload, and say which of a and b are pinned."""
    peer.write_dropin(DROPIN, pins(*patterns))
    await peer.reload()
    return await pinned(peer, images.a, images.b)


async def pull(peer: Peer, *refs: str) -> None:
    for ref in refs:
        await peer.runtime.pull_image(ref, timeout_s=60)


def upper_repository(ref: str) -> str:
    """``host/ns/name@digest`` with the repository part (``ns/name``) in capitals."""
    name, _, digest = ref.partition("@")
    host, _, repository = name.partition("/")
    return f"{host}/{repository.upper()}@{digest}"


# ---------------------------------------------------------------- identity and store
async def version_is_cri_o_1_34(peer: Peer) -> None:
    assert await peer.runtime.version() == VERSION


async def pulled_by_digest_is_listed_with_its_repo_digest(peer: Peer, images: Images) -> None:
    assert await peer.runtime.list_images() == []
    pulled = await peer.runtime.pull_image(images.a, timeout_s=60)
    status = await peer.runtime.image_status(images.a)
    assert status is not None
    assert pulled in (status.id, *status.repo_digests)
    assert (status.repo_tags, status.repo_digests, status.is_pinned) == ((), (images.a,), False)
    assert status.size_bytes > 0
    assert await peer.runtime.image_status(status.id) == status
    assert await peer.runtime.list_images() == [status]
    assert await peer.runtime.image_status(images.b) is None


async def one_image_under_two_names_is_one_image(peer: Peer, images: Images) -> None:
    await pull(peer, images.a, images.a_copy)
    [image] = await peer.runtime.list_images()
    assert image.repo_digests == tuple(sorted((images.a, images.a_copy)))
    assert await peer.runtime.image_status(images.a_copy) == image
    # Removing it by one name drops that name only; by the last name, the image.
    await peer.runtime.remove_image(images.a_copy)
    assert await peer.runtime.image_status(images.a_copy) is None
    kept = await peer.runtime.image_status(images.a)
    assert kept is not None
    assert (kept.id, kept.repo_digests) == (image.id, (images.a,))
    await peer.runtime.remove_image(images.a)
    assert await peer.runtime.list_images() == []
    await peer.runtime.remove_image(images.a)  # absent: no error


async def upper_case_repository_is_refused(peer: Peer, images: Images) -> None:
    await pull(peer, images.a)
    with pytest.raises(errors.RuntimeCallFailed, match="must be lowercase"):
        await peer.runtime.image_status(upper_repository(images.a))


async def image_fs_info_is_the_image_metadata_directory(peer: Peer, images: Images) -> None:
    [empty] = await peer.runtime.image_fs_info()
    path = PurePosixPath(empty.mountpoint)
    assert path.is_absolute()
    assert path.name.endswith("-images")  # <graphroot>/<driver>-images
    assert empty.used_bytes > 0
    assert empty.inodes_used > 0
    await pull(peer, images.a)
    [used] = await peer.runtime.image_fs_info()
    assert used.mountpoint == empty.mountpoint
    assert used.used_bytes > empty.used_bytes
    assert used.inodes_used > empty.inodes_used


# ---------------------------------------------------------------- when pins apply
async def pins_apply_on_reload_not_on_write(peer: Peer, images: Images) -> None:
    await pull(peer, images.a, images.b)
    peer.write_dropin(DROPIN, pins(images.a))
    assert await pinned(peer, images.a, images.b) == [False, False]
    await peer.reload()
    assert await pinned(peer, images.a, images.b) == [True, False]


async def pins_apply_at_start(peer: Peer, images: Images) -> None:
    await pull(peer, images.a, images.b)
    peer.write_dropin(DROPIN, pins(images.b))
    await peer.restart()
    assert await pinned(peer, images.a, images.b) == [False, True]


async def removing_or_emptying_the_list_unpins_on_reload(peer: Peer, images: Images) -> None:
    await pull(peer, images.a, images.b)
    assert await pin_with(peer, images, images.a, images.b) == [True, True]
    peer.remove_dropin(DROPIN)
    assert await pinned(peer, images.a, images.b) == [True, True]  # until the reload
    await peer.reload()
    assert await pinned(peer, images.a, images.b) == [False, False]
    assert await pin_with(peer, images, images.a) == [True, False]
    assert await pin_with(peer, images) == [False, False]  # pinned_images = []


# ---------------------------------------------------------------- patterns
async def exact_pattern_is_the_whole_name_ignoring_case(peer: Peer, images: Images) -> None:
    await pull(peer, images.a, images.b)
    assert await pin_with(peer, images, images.a) == [True, False]
    assert await pin_with(peer, images, images.a.upper()) == [True, False]
    assert await pin_with(peer, images, images.a.split("@")[0]) == [False, False]
    assert await pin_with(peer, images, images.a[:-1]) == [False, False]
    assert await pin_with(peer, images, "*" + images.a[1:]) == [False, False]  # literal star


async def a_pattern_for_one_name_pins_the_image_under_all(peer: Peer, images: Images) -> None:
    await pull(peer, images.a, images.a_copy, images.b)
    assert await pin_with(peer, images, images.a_copy) == [True, False]
    assert await pinned(peer, images.a_copy) == [True]


async def trailing_star_is_a_prefix_found_anywhere(peer: Peer, images: Images) -> None:
    await pull(peer, images.a, images.b)
    assert await pin_with(peer, images, f"{images.host}/nodeagent-contract/app-*") == [True, True]
    assert await pin_with(peer, images, "nodeagent-contract/app-b*") == [False, True]
    assert await pin_with(peer, images, "NODEAGENT-CONTRACT/APP-A*") == [True, False]
    assert await pin_with(peer, images, "nodeagent-contract/app-a@sha256*") == [True, False]
    assert await pin_with(peer, images, "nodeagent.contract/app-*") == [False, False]  # a dot
    assert await pin_with(peer, images, f"{images.host}/nodeagent-contract/copy*") == [False] * 2


async def star_keyword_star_is_found_anywhere(peer: Peer, images: Images) -> None:
    await pull(peer, images.a, images.b)
    assert await pin_with(peer, images, "*app-b*") == [False, True]
    assert await pin_with(peer, images, "*APP-A@*") == [True, False]
    assert await pin_with(peer, images, "*contract/app-*") == [True, True]
    assert await pin_with(peer, images, "**") == [True, True]  # the empty keyword
    assert await pin_with(peer, images, "*app.a*") == [False, False]


# ---------------------------------------------------------------- several files
async def each_file_setting_the_list_replaces_it(peer: Peer, images: Images) -> None:
    await pull(peer, images.a, images.b)
    peer.write_dropin("10-first.conf", pins(images.a))
    peer.write_dropin("20-second.conf", pins(images.b))
    await peer.reload()
    assert await pinned(peer, images.a, images.b) == [False, True]
    peer.write_dropin("30-silent.conf", '[crio.image]\n# pinned_images = ["x"]\n')
    await peer.reload()
    assert await pinned(peer, images.a, images.b) == [False, True]  # no key: list kept
    peer.write_dropin("40-empty.conf", pins())
    await peer.reload()
    assert await pinned(peer, images.a, images.b) == [False, False]


async def files_are_read_in_bytewise_order_of_their_names(peer: Peer, images: Images) -> None:
    await pull(peer, images.a, images.b)
    # Bytewise, "10-…" < "9-…": 9 comes last and wins (a numeric sort would pick 10).
    peer.write_dropin("9-pins.conf", pins(images.a))
    peer.write_dropin("10-pins.conf", pins(images.b))
    await peer.reload()
    assert await pinned(peer, images.a, images.b) == [True, False]
    # Bytewise, "Z" < "a": a-… comes last (a case-folding sort would pick Z-…).
    peer.write_dropin("a-pins.conf", pins(images.b))
    peer.write_dropin("Z-pins.conf", pins(images.a))
    await peer.reload()
    assert await pinned(peer, images.a, images.b) == [False, True]
