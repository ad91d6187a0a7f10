"""systemd/container/nodeagent-image-select: which image nodeagent.service runs. The daemon's
self-update runs only while based on the MachineConfig's digest and never rejected; a new
MachineConfig digest makes it step aside; with nothing pinned, the loaded image; nothing at
all is an error, never an empty reference."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.unit.container import ROOT

SELECT = ROOT / "systemd/container/nodeagent-image-select"
A, B, C = ("sha256:" + c * 64 for c in "abc")


def select(state: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {"PATH": os.environ["PATH"], "NODEAGENT_IMAGE_STATE": str(state)}
    environ |= {f"NODEAGENT_IMAGE_{k.upper()}": v for k, v in env.items()}
    return subprocess.run(
        ["bash", str(SELECT)], env=environ, capture_output=True, text=True, check=False
    )


def chosen(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().removeprefix("NODEAGENT_IMAGE=localhost/nodeagent@")


def test_the_pinned_digest_runs(tmp_path: Path) -> None:
    assert chosen(select(tmp_path, pinned=A)) == A


def test_a_self_update_based_on_the_pinned_digest_runs(tmp_path: Path) -> None:
    assert chosen(select(tmp_path, pinned=A, next=B, next_base=A)) == B


def test_a_new_machineconfig_digest_makes_the_update_step_aside(tmp_path: Path) -> None:
    result = select(tmp_path, pinned=C, next=B, next_base=A)
    assert chosen(result) == C
    assert "steps aside" in result.stderr


def test_a_rejected_update_never_runs_again(tmp_path: Path) -> None:
    (tmp_path / "rejected").write_text(f"{B}\n")
    assert chosen(select(tmp_path, pinned=A, next=B, next_base=A)) == A


def test_without_a_pinned_digest_the_loaded_image_runs(tmp_path: Path) -> None:
    (tmp_path / "loaded").write_text(f"{A}\n")
    assert chosen(select(tmp_path)) == A
    assert chosen(select(tmp_path, next=B, next_base=A)) == B


def test_no_digest_at_all_fails_and_a_malformed_one_is_ignored(tmp_path: Path) -> None:
    assert select(tmp_path).returncode == 1
    result = select(tmp_path, pinned="sha256:../../etc", next=B, next_base="sha256:../../etc")
    assert result.returncode == 1
    assert "not a sha256 digest" in result.stderr


def test_write_replaces_the_environment_file(tmp_path: Path) -> None:
    target = tmp_path / "image.env"
    environ = {"PATH": os.environ["PATH"], "NODEAGENT_IMAGE_STATE": str(tmp_path)}
    environ["NODEAGENT_IMAGE_PINNED"] = A
    cmd = ["bash", str(SELECT), "--write", str(target)]
    subprocess.run(cmd, env=environ, check=True, capture_output=True)
    assert target.read_text() == (
        f"NODEAGENT_IMAGE=localhost/nodeagent@{A}\nNODEAGENT_IMAGE_REASON=machineconfig\n"
        f"NODEAGENT_IMAGE_BASE={A}\n"
    )


def test_the_written_file_names_what_a_self_update_is_based_on(tmp_path: Path) -> None:
    """NODEAGENT_IMAGE_BASE: the pinned digest (else the loaded one), even while an update
    runs: nodeagent-image-load --incoming bases the next update on it."""
    target = tmp_path / "image.env"
    environ = {"PATH": os.environ["PATH"], "NODEAGENT_IMAGE_STATE": str(tmp_path)}
    environ |= {"NODEAGENT_IMAGE_PINNED": A, "NODEAGENT_IMAGE_NEXT": B}
    environ |= {"NODEAGENT_IMAGE_NEXT_BASE": A}
    cmd = ["bash", str(SELECT), "--write", str(target)]
    subprocess.run(cmd, env=environ, check=True, capture_output=True)
    lines = target.read_text().splitlines()
    assert f"NODEAGENT_IMAGE=localhost/nodeagent@{B}" in lines
    assert f"NODEAGENT_IMAGE_BASE={A}" in lines
