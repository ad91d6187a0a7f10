"""systemd/container/nodeagent-image-rollback, the host's judge of a self-update, against a
stand-in systemctl: a failed update is rejected and the unit goes back to the self-update
that ran before it (nodeagent-image-load --incoming kept its drop-in), or to the
MachineConfig's or loaded image; an update that stays up for the window is accepted; what
is not a self-update is never judged."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from tests.unit.container import ROOT

ROLLBACK = ROOT / "systemd/container/nodeagent-image-rollback"
A, B, C = ("sha256:" + c * 64 for c in "abc")


class Host:
    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        self.state.mkdir()
        self.dropin = tmp / "50-self-update.conf"
        self.env_file = tmp / "image.env"
        self.calls = tmp / "calls"
        self.restarts = tmp / "restarts"
        self.restarts.write_text("0")
        self.systemctl = tmp / "systemctl"
        self.systemctl.write_text(
            "#!/bin/sh\n"
            f'echo "$*" >> {self.calls}\n'
            f'case "$*" in *NRestarts*) cat {self.restarts};; *ActiveState*) echo active;; esac\n'
        )
        self.systemctl.chmod(self.systemctl.stat().st_mode | stat.S_IXUSR)

    def running(self, digest: str, reason: str) -> None:
        self.env_file.write_text(
            f"NODEAGENT_IMAGE=localhost/nodeagent@{digest}\nNODEAGENT_IMAGE_REASON={reason}\n"
        )

    def run(self, mode: str, window_s: int = 300) -> str:
        env = {
            "PATH": os.environ["PATH"],
            "NODEAGENT_IMAGE_STATE": str(self.state),
            "NODEAGENT_IMAGE_DROPIN": str(self.dropin),
            "NODEAGENT_IMAGE_ENV": str(self.env_file),
            "NODEAGENT_IMAGE_TRIAL_S": str(window_s),
            "NODEAGENT_SYSTEMCTL": str(self.systemctl),
        }
        done = subprocess.run(
            ["bash", str(ROLLBACK), mode], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def called(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def test_a_failed_update_goes_back_to_the_update_before_it(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.running(C, "self-update")
    host.dropin.write_text(f"[Service]\nEnvironment=NODEAGENT_IMAGE_NEXT={C}\n")
    previous = f"[Service]\nEnvironment=NODEAGENT_IMAGE_NEXT={B}\n"
    (host.state / "previous-self-update.conf").write_text(previous)
    out = host.run("--failed")
    assert f"nodeagent_image_rolled_back: image={C}" in out
    assert (host.state / "rejected").read_text() == f"{C}\n"
    assert host.dropin.read_text() == previous
    assert not (host.state / "previous-self-update.conf").exists()
    assert host.called() == [
        "daemon-reload",
        "reset-failed nodeagent.service",
        "restart --no-block nodeagent.service",
    ]


def test_a_failed_first_update_removes_the_drop_in(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.running(B, "self-update")
    host.dropin.write_text(f"[Service]\nEnvironment=NODEAGENT_IMAGE_NEXT={B}\n")
    host.run("--failed")
    assert not host.dropin.exists()
    assert (host.state / "rejected").read_text() == f"{B}\n"


def test_what_is_not_a_self_update_is_never_judged(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.running(A, "machineconfig")
    host.run("--failed")
    host.run("--check")
    assert host.called() == []
    assert not (host.state / "rejected").exists()


def test_an_update_up_for_the_window_is_accepted(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.running(B, "self-update")
    assert "nodeagent_image_trial_started" in host.run("--check", window_s=0)
    assert "nodeagent_image_accepted" in host.run("--check", window_s=0)
    assert (host.state / "accepted").read_text() == f"{B}\n"
    host.run("--failed")  # accepted: a later failure is the unit's own, not the image's
    assert not (host.state / "rejected").exists()


def test_an_update_that_restarted_during_its_trial_is_rolled_back(tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.running(B, "self-update")
    host.run("--check")
    host.restarts.write_text("3")
    assert f"nodeagent_image_rolled_back: image={B}" in host.run("--check")
    assert (host.state / "rejected").read_text() == f"{B}\n"
