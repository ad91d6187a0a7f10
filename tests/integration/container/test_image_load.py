"""The first image from a stick (systemd/container/nodeagent-image-load): a signed oci-archive
on an ext4 loop device is checked with openssl against the agent image keys, loaded with
podman into nodeagent's own storage (not CRI-O's) and its digest recorded for the unit."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.testenv.agent_image import (
    LoaderPaths,
    SignedArchive,
    ed25519_key,
    run_loader,
    tiny_archive,
)
from tests.testenv.bundles import ext4_media
from tests.testenv.udev import LoopMedia, free_loop_device


@pytest.fixture
def paths(tmp_path: Path) -> Iterator[LoaderPaths]:
    # podman refuses a run root longer than 50 characters: a short temporary one.
    with tempfile.TemporaryDirectory(prefix="na-run.") as runroot:
        yield LoaderPaths.under(tmp_path / "node", runroot=Path(runroot))


@pytest.fixture
def signed(tmp_path: Path, paths: LoaderPaths) -> SignedArchive:
    private, public = ed25519_key(tmp_path / "factory", "agent-images")
    public.rename(paths.keys / "agent-images.pem")
    return tiny_archive(tmp_path / "made", private)


@pytest.fixture
def stick(tmp_path: Path, signed: SignedArchive) -> Iterator[str]:
    media: LoopMedia = ext4_media(tmp_path, signed.archive.parent.parent, label="NODEAGENT-IMG")
    devnode = media.attach(free_loop_device())
    try:
        yield devnode
    finally:
        media.detach()


def test_a_signed_archive_on_a_stick_is_loaded_and_recorded(
    paths: LoaderPaths, signed: SignedArchive, stick: str
) -> None:
    done = run_loader(paths, stick)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "<5>nodeagent_image_loaded: archive=" in done.stdout
    assert f"digest={signed.digest}" in done.stdout
    assert (paths.state / "loaded").read_text().strip() == signed.digest
    exists = paths.podman("image", "exists", f"localhost/nodeagent@{signed.digest}")
    assert exists.returncode == 0, exists.stderr
    # A second run finds it stored: nothing loaded again, still usable.
    again = run_loader(paths)
    assert again.returncode == 0, again.stdout + again.stderr


def test_no_stick_and_nothing_stored_says_what_to_do(paths: LoaderPaths) -> None:
    done = run_loader(paths, "/dev/null-no-such-device")
    assert done.returncode == 1
    assert "<4>nodeagent_image_missing" in done.stdout
    assert not (paths.state / "loaded").exists()
