"""Anti-rollback of the first-image loader (systemd/container/nodeagent-image-load, decision
0074): an image statement carries a signed ``sequence``; a node that accepted sequence N
never loads one below N, nor another image under N, even signed by a trusted agent image
key: an attacker holding an old, genuinely signed image (with a known hole) cannot put it
back on a node. The record is ``$STATE/sequence``; damaged, it refuses everything."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.testenv.agent_image import (
    LoaderPaths,
    SignedArchive,
    build_image_tool,
    ed25519_key,
    run_loader,
    tiny_archive,
)
from tests.testenv.bundles import ext4_media
from tests.testenv.udev import free_loop_device

NEWER = "sha256:" + "e" * 64


@pytest.fixture
def paths(tmp_path: Path) -> Iterator[LoaderPaths]:
    with tempfile.TemporaryDirectory(prefix="na-run.") as runroot:
        yield LoaderPaths.under(tmp_path / "node", runroot=Path(runroot))


@pytest.fixture
def key(tmp_path: Path, paths: LoaderPaths) -> Path:
    """A genuine agent image key: every archive below is signed by the factory."""
    private, public = ed25519_key(tmp_path / "factory", "agent")
    public.rename(paths.keys / "agent.pem")
    return private


def plug(tmp_path: Path, paths: LoaderPaths, signed: SignedArchive) -> tuple[int, str]:
    media = ext4_media(tmp_path, signed.archive.parent.parent, label="NODEAGENT-IMG")
    devnode = media.attach(free_loop_device())
    try:
        done = run_loader(paths, devnode)
    finally:
        media.detach()
    return done.returncode, done.stdout + done.stderr


def stored(paths: LoaderPaths) -> str:
    return paths.podman("images", "--quiet", "--no-trunc").stdout.strip()


def test_an_older_signed_image_is_refused(tmp_path: Path, paths: LoaderPaths, key: Path) -> None:
    (paths.state / "sequence").write_text(f"2000 {NEWER}\n")
    old = tiny_archive(tmp_path / "old", key, version="1.0.0", sequence=1999)
    code, out = plug(tmp_path, paths, old)
    assert code == 1, out
    assert "reason=ImageRollback" in out
    assert stored(paths) == ""
    assert (paths.state / "sequence").read_text() == f"2000 {NEWER}\n"
    assert not (paths.state / "loaded").exists()


def test_another_image_under_the_same_sequence_is_refused(
    tmp_path: Path, paths: LoaderPaths, key: Path
) -> None:
    (paths.state / "sequence").write_text(f"2000 {NEWER}\n")
    twin = tiny_archive(tmp_path / "twin", key, version="2.0.0-evil", sequence=2000)
    code, out = plug(tmp_path, paths, twin)
    assert code == 1 and "reason=ImageRollback" in out, out
    assert stored(paths) == ""


def test_a_damaged_record_refuses_rather_than_guesses(
    tmp_path: Path, paths: LoaderPaths, key: Path
) -> None:
    (paths.state / "sequence").write_text("02000 not-a-digest\n")
    newer = tiny_archive(tmp_path / "newer", key, sequence=5000)
    code, out = plug(tmp_path, paths, newer)
    assert code == 1 and "reason=ImageSequenceUnknown" in out, out
    assert stored(paths) == ""


def test_a_statement_without_a_sequence_is_refused(
    tmp_path: Path, paths: LoaderPaths, key: Path
) -> None:
    """The v1 form (no sequence) cannot be ordered: re-signed without the line, refused."""
    signed = tiny_archive(tmp_path / "made", key)
    lines = signed.statement.read_text().splitlines()
    body = [ln for ln in lines if not ln.startswith("sequence=")]
    body[0] = "nodeagent-image-statement-v1"
    tool_sign(signed.statement, "\n".join(body) + "\n", key)
    code, out = plug(tmp_path, paths, signed)
    assert code == 1 and "reason=ImageStatementInvalid" in out, out
    assert stored(paths) == ""


def test_a_sequence_with_a_leading_zero_is_refused(
    tmp_path: Path, paths: LoaderPaths, key: Path
) -> None:
    """``010`` would be eight to the shell's arithmetic: one spelling of a number only."""
    (paths.state / "sequence").write_text(f"9 {NEWER}\n")
    signed = tiny_archive(tmp_path / "made", key)
    text = signed.statement.read_text().replace("sequence=1000", "sequence=010")
    tool_sign(signed.statement, text, key)
    code, out = plug(tmp_path, paths, signed)
    assert code == 1 and "reason=ImageStatementInvalid" in out, out


def test_a_newer_image_loads_and_raises_the_record(
    tmp_path: Path, paths: LoaderPaths, key: Path
) -> None:
    (paths.state / "sequence").write_text(f"1000 {NEWER}\n")
    newer = tiny_archive(tmp_path / "newer", key, sequence=1001)
    code, out = plug(tmp_path, paths, newer)
    assert code == 0, out
    assert "nodeagent_image_loaded" in out and "sequence=1001" in out
    assert (paths.state / "sequence").read_text() == f"1001 {newer.digest}\n"
    assert (paths.state / "loaded").read_text().strip() == newer.digest


def tool_sign(statement: Path, text: str, key: Path) -> None:
    build_image_tool().sign_statement(statement, text.encode(), key)
