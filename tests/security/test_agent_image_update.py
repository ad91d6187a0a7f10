"""The host's side of a self-update (``nodeagent-image-load --incoming``, decision 0074): what
the daemon staged from a bundle (statement, signature, the image's layout) is checked again
on the host, with the stick's rules, before anything is loaded or the unit switched: a
bundle key's signature, an older sequence, a digest rolled back before, a layout holding
another image than the signed one are refused; nothing is loaded, no drop-in is written,
nodeagent is not restarted, and the staged directory is removed either way."""

from __future__ import annotations

import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.testenv.agent_image import (
    LoaderPaths,
    ed25519_key,
    run_loader,
    staged_update,
    tiny_layout,
)

BASE = "sha256:" + "b" * 64


class Host:
    def __init__(self, tmp: Path, paths: LoaderPaths) -> None:
        self.paths = paths
        self.incoming = paths.state / "incoming"
        self.incoming.mkdir()
        self.dropin = tmp / "etc/nodeagent.service.d/50-self-update.conf"
        self.env_file = tmp / "image.env"
        self.env_file.write_text(
            f"NODEAGENT_IMAGE=localhost/nodeagent@{BASE}\nNODEAGENT_IMAGE_REASON=machineconfig\n"
            f"NODEAGENT_IMAGE_BASE={BASE}\n"
        )
        self.calls = tmp / "systemctl.calls"
        self.systemctl = tmp / "systemctl"
        self.systemctl.write_text(f'#!/bin/sh\necho "$*" >> {self.calls}\n')
        self.systemctl.chmod(self.systemctl.stat().st_mode | stat.S_IXUSR)

    def stage(self, staged: Path) -> None:
        shutil.move(staged, self.incoming / "next")

    def run(self) -> tuple[int, str]:
        env = {
            "NODEAGENT_IMAGE_DROPIN": str(self.dropin),
            "NODEAGENT_IMAGE_ENV": str(self.env_file),
            "NODEAGENT_SYSTEMCTL": str(self.systemctl),
        }
        done = run_loader(self.paths, "--incoming", env=env)
        return done.returncode, done.stdout + done.stderr

    def stored(self) -> str:
        return self.paths.podman("images", "--quiet").stdout.strip()

    def assert_untouched(self) -> None:
        assert self.stored() == ""
        assert not self.dropin.exists()
        assert not self.calls.exists(), self.calls.read_text()
        assert list(self.incoming.iterdir()) == []  # judged: removed, no trigger loop


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    with tempfile.TemporaryDirectory(prefix="na-run.") as runroot:
        yield Host(tmp_path, LoaderPaths.under(tmp_path / "node", runroot=Path(runroot)))


@pytest.fixture
def agent_key(tmp_path: Path, host: Host) -> Path:
    private, public = ed25519_key(tmp_path / "factory", "agent")
    public.rename(host.paths.keys / "agent.pem")
    return private


def test_a_signed_newer_image_is_stored_then_the_unit_switched(
    tmp_path: Path, host: Host, agent_key: Path
) -> None:
    staged, digest = staged_update(tmp_path / "u", agent_key, sequence=3000)
    host.stage(staged)
    code, out = host.run()
    assert code == 0, out
    assert "nodeagent_image_updating" in out
    assert host.paths.podman("image", "exists", f"localhost/nodeagent@{digest}").returncode == 0
    text = host.dropin.read_text()
    assert f"Environment=NODEAGENT_IMAGE_NEXT={digest}\n" in text
    assert f"Environment=NODEAGENT_IMAGE_NEXT_BASE={BASE}\n" in text
    assert host.calls.read_text().splitlines() == [
        "daemon-reload",
        "restart --no-block nodeagent.service",
    ]
    assert (host.paths.state / "sequence").read_text() == f"3000 {digest}\n"
    assert list(host.incoming.iterdir()) == []


def test_a_bundle_key_alone_switches_nothing(tmp_path: Path, host: Host, agent_key: Path) -> None:
    """The bundle's signer signs the statement too: not an agent image key."""
    bundle_private, _ = ed25519_key(tmp_path / "bundle", "bundle")
    staged, _ = staged_update(tmp_path / "u", bundle_private)
    host.stage(staged)
    code, out = host.run()
    assert code == 1 and "reason=ImageSignatureInvalid" in out, out
    host.assert_untouched()


def test_an_older_image_switches_nothing(tmp_path: Path, host: Host, agent_key: Path) -> None:
    (host.paths.state / "sequence").write_text(f"5000 {BASE}\n")
    staged, _ = staged_update(tmp_path / "u", agent_key, sequence=4999)
    host.stage(staged)
    code, out = host.run()
    assert code == 1 and "reason=ImageRollback" in out, out
    host.assert_untouched()


def test_an_image_rolled_back_before_is_not_tried_again(
    tmp_path: Path, host: Host, agent_key: Path
) -> None:
    staged, digest = staged_update(tmp_path / "u", agent_key)
    (host.paths.state / "rejected").write_text(f"{digest}\n")
    host.stage(staged)
    code, out = host.run()
    assert code == 1 and "reason=ImageRollback" in out, out
    host.assert_untouched()


def test_a_layout_swapped_after_signing_is_refused(
    tmp_path: Path, host: Host, agent_key: Path
) -> None:
    """A signed statement for image A beside the layout of image B: podman loads B, which
    does not answer to A's digest: refused, no drop-in."""
    staged, _ = staged_update(tmp_path / "u", agent_key)
    evil, _ = tiny_layout(tmp_path / "evil", "6.6.6")
    shutil.rmtree(staged / "layout")
    evil.rename(staged / "layout")
    host.stage(staged)
    code, out = host.run()
    assert code == 1 and "reason=ImageDigestMismatch" in out, out
    assert not host.dropin.exists() and not host.calls.exists()


def test_without_a_running_image_there_is_no_base(
    tmp_path: Path, host: Host, agent_key: Path
) -> None:
    host.env_file.unlink()
    staged, _ = staged_update(tmp_path / "u", agent_key)
    host.stage(staged)
    code, out = host.run()
    assert code == 1 and "reason=ImageBaseUnknown" in out, out
    host.assert_untouched()


def test_the_update_in_effect_is_kept_to_go_back_to(
    tmp_path: Path, host: Host, agent_key: Path
) -> None:
    """A second self-update over a first: the first's drop-in is what a rollback restores
    (nodeagent-image-rollback), not the image the node started from."""
    host.dropin.parent.mkdir(parents=True)
    first = "[Service]\nEnvironment=NODEAGENT_IMAGE_NEXT=sha256:" + "c" * 64 + "\n"
    host.dropin.write_text(first)
    staged, digest = staged_update(tmp_path / "u", agent_key, sequence=3001)
    host.stage(staged)
    code, out = host.run()
    assert code == 0, out
    assert (host.paths.state / "previous-self-update.conf").read_text() == first
    assert f"NODEAGENT_IMAGE_NEXT={digest}" in host.dropin.read_text()
