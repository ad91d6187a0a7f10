"""Attacks on the first-image loader (systemd/container/nodeagent-image-load, decision 0071):
new code as root on the node takes a signature by an agent image key; a bundle key, a
swapped archive or an edited statement loads nothing."""

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
from tests.testenv.udev import free_loop_device


@pytest.fixture
def paths(tmp_path: Path) -> Iterator[LoaderPaths]:
    with tempfile.TemporaryDirectory(prefix="na-run.") as runroot:
        yield LoaderPaths.under(tmp_path / "node", runroot=Path(runroot))


def plug_and_load(tmp_path: Path, paths: LoaderPaths, signed: SignedArchive) -> str:
    media = ext4_media(tmp_path, signed.archive.parent.parent, label="NODEAGENT-IMG")
    devnode = media.attach(free_loop_device())
    try:
        done = run_loader(paths, devnode)
    finally:
        media.detach()
    assert done.returncode == 1, done.stdout + done.stderr
    assert not (paths.state / "loaded").exists()
    stored = paths.podman("images", "--quiet")
    assert stored.stdout.strip() == "", stored.stdout
    return done.stdout


def test_a_bundle_key_is_not_an_agent_image_key(tmp_path: Path, paths: LoaderPaths) -> None:
    """The attacker holds a bundle signing key (trusted-keys.d), not an agent image key."""
    bundle_private, bundle_public = ed25519_key(tmp_path / "bundle", "bundle")
    trusted_keys = tmp_path / "node/trusted-keys.d"
    trusted_keys.mkdir(parents=True)
    bundle_public.rename(trusted_keys / "bundle.pem")  # trusted for bundles only
    _, agent_public = ed25519_key(tmp_path / "factory", "agent")
    agent_public.rename(paths.keys / "agent.pem")
    signed = tiny_archive(tmp_path / "made", bundle_private)
    out = plug_and_load(tmp_path, paths, signed)
    assert "reason=ImageSignatureInvalid" in out


def test_an_archive_swapped_after_signing_is_not_loaded(tmp_path: Path, paths: LoaderPaths) -> None:
    private, public = ed25519_key(tmp_path / "factory", "agent")
    public.rename(paths.keys / "agent.pem")
    signed = tiny_archive(tmp_path / "made", private)
    evil = tiny_archive(tmp_path / "evil", private, version="6.6.6")
    signed.archive.write_bytes(evil.archive.read_bytes())  # the old statement stays
    out = plug_and_load(tmp_path, paths, signed)
    assert "reason=ImageDigestMismatch" in out


def test_an_edited_statement_fails_its_signature(tmp_path: Path, paths: LoaderPaths) -> None:
    private, public = ed25519_key(tmp_path / "factory", "agent")
    public.rename(paths.keys / "agent.pem")
    signed = tiny_archive(tmp_path / "made", private)
    text = signed.statement.read_text()
    signed.statement.write_text(text.replace("manifest-digest=sha256:", "manifest-digest=sha256:0"))
    out = plug_and_load(tmp_path, paths, signed)
    assert "reason=ImageSignatureInvalid" in out


def test_an_unsigned_archive_is_not_loaded(tmp_path: Path, paths: LoaderPaths) -> None:
    private, public = ed25519_key(tmp_path / "factory", "agent")
    public.rename(paths.keys / "agent.pem")
    signed = tiny_archive(tmp_path / "made", private)
    Path(f"{signed.statement}.sig").unlink()
    out = plug_and_load(tmp_path, paths, signed)
    assert "reason=ImageUnsigned" in out
