"""The FIPS posture: the kernel's switch read strictly (unknown stays unknown), the
Ed25519 known-answer test through the real ``cryptography``, and what the status and
``check-config`` say of it (decision 0075)."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nodeagent.adapters.fips import read_host_fips, read_posture
from nodeagent.fips import CryptoPosture, posture_line, probe
from nodeagent.reporting import Reporter
from nodeagent.status import NodeStatus
from tests.fakes.ports import MemoryStore, RecordingLine


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1\n", True), ("0\n", False), ("2\n", None), ("", None), ("1" * 64, None), ("yes", None)],
)
def test_the_kernel_switch_is_read_strictly(
    tmp_path: Path, text: str, expected: bool | None
) -> None:
    path = tmp_path / "fips_enabled"
    path.write_text(text)
    assert read_host_fips(path) is expected


def test_a_kernel_without_the_switch_is_unknown_not_off(tmp_path: Path) -> None:
    assert read_host_fips(tmp_path / "absent") is None
    posture = read_posture(always_probe=False, path=tmp_path / "absent")
    assert (posture.host_fips, posture.ed25519, posture.backend) == (
        None,
        "not-checked",
        "not loaded",
    )
    assert posture.reason is None
    assert "FIPS mode unknown; Ed25519 not checked" in posture_line(posture)


def test_the_daemon_tests_ed25519_only_on_a_fips_host(tmp_path: Path) -> None:
    switch = tmp_path / "fips_enabled"
    switch.write_text("0\n")
    assert read_posture(always_probe=False, path=switch).ed25519 == "not-checked"
    assert read_posture(always_probe=True, path=switch).ed25519 == "verifies"
    switch.write_text("1\n")
    on = read_posture(always_probe=False, path=switch)
    assert on.host_fips is True and on.backend.startswith("cryptography ")


def test_the_known_answer_verifies_with_this_backend() -> None:
    posture = probe(False)
    assert posture.ed25519 == "verifies", posture.detail
    assert posture.backend_fips is False
    assert posture.to_json() == {
        "hostFips": False, "backend": posture.backend, "backendFips": False, "ed25519": "verifies",
    }  # fmt: skip


def test_a_refusal_carries_its_reason_and_what_to_do() -> None:
    refused = CryptoPosture(True, "cryptography 1 with OpenSSL 3", True, "refused", "ValueError")
    doc = refused.to_json()
    assert doc["reason"] == "Ed25519Refused"
    assert "FIPS-mode host" in doc["message"] and "decision 0075" in doc["message"]
    assert posture_line(refused).startswith("crypto: FIPS mode on; Ed25519 REFUSED with")


def test_a_library_that_cannot_be_loaded_refuses(tmp_path: Path) -> None:
    """A child whose ``cryptography`` import fails (a stub that raises ImportError first on
    the path): the posture says refused with the cause, the node OS task goes on."""
    import os
    import subprocess
    import sys

    import nodeagent

    stub = tmp_path / "cryptography"
    stub.mkdir()
    (stub / "__init__.py").write_text("raise ImportError('no OpenSSL here')\n")
    code = "from nodeagent.fips import probe; p = probe(True); print(p.ed25519, p.reason, p.detail)"
    path = f"{tmp_path}{os.pathsep}{Path(nodeagent.__file__).resolve().parents[1]}"
    shown = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=path),
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    assert shown.strip() == "refused Ed25519Refused cannot load cryptography: no OpenSSL here"


def test_the_reporter_journals_a_refusal_and_every_status_carries_the_posture() -> None:
    store = MemoryStore()
    reporter = Reporter(line=RecordingLine(), store=store)
    refused = CryptoPosture(True, "cryptography 1 with OpenSSL 3", True, "refused", "ValueError")
    with capture_logs() as logs:
        reporter.crypto_read(refused)
        reporter.crypto_read(CryptoPosture(False, "not loaded", None, "not-checked"))
    events = [(e["event"], e["log_level"]) for e in logs]
    assert events == [
        ("crypto_posture_read", "info"), ("ed25519_refused", "warning"),
        ("crypto_posture_read", "info"),
    ]  # fmt: skip
    assert logs[1]["reason"] == "Ed25519Refused"
    reporter.sync_finished(NodeStatus(sets=(), conditions=()))
    assert store.docs["status"]["crypto"]["ed25519"] == "not-checked"
    reporter.crypto_read(refused)  # read after a sync: the status file says it at once
    assert store.docs["status"]["crypto"]["reason"] == "Ed25519Refused"
