"""``nodeagent bundle keygen`` makes keys minisign itself uses (issue 28): minisign signs with
the secret key (asking its password on a terminal when encrypted) and verifies with the
public one; nodeagent reads both; file modes are 0600 and 0644; an existing key is never
overwritten. Real parts: Debian's minisign 0.11."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.bundles import minisign
from tests.integration.bundles.test_minisign import run_ok, run_with_password

pytestmark = pytest.mark.integration


def keygen(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodeagent", "bundle", "keygen", *map(str, args)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_an_unencrypted_pair_signs_and_verifies_with_minisign(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    done = keygen("--name", "factory", "--unencrypted", "--output-dir", keys)
    assert done.returncode == 0, done.stderr
    assert "copy factory.pub to /etc/nodeagent/trusted-keys.d/" in done.stdout
    assert (keys / "factory.key").stat().st_mode & 0o777 == 0o600
    assert (keys / "factory.pub").stat().st_mode & 0o777 == 0o644
    message = tmp_path / "bundle.json"
    message.write_text('{"formatVersion": 3}\n')
    run_ok("-S", "-s", keys / "factory.key", "-m", message)
    run_ok("-V", "-p", keys / "factory.pub", "-m", message)
    public = minisign.parse_public_key((keys / "factory.pub").read_text())
    assert public.key_id_hex in done.stdout
    again = keygen("--name", "factory", "--unencrypted", "--output-dir", keys)
    assert again.returncode == 74 and "error: HostFileError: " in again.stderr
    assert "never overwrites a key" in again.stderr


@pytest.mark.timeout(180)  # three scrypt runs at minisign's 1 GiB limits: ~10 s quiet, 35 s loaded
def test_an_encrypted_secret_key_is_minisign_s_to_open_with_its_password(tmp_path: Path) -> None:
    keys, password = tmp_path / "keys", tmp_path / "password"
    password.write_text("correct horse\n")
    done = keygen("--name", "site", "--password-file", password, "--output-dir", keys, "--json")
    assert done.returncode == 0, done.stderr
    assert '"encrypted": true' in done.stdout
    message = tmp_path / "bundle.json"
    message.write_text("{}\n")
    run_with_password("-S", "-s", keys / "site.key", "-m", message, password="correct horse")
    run_ok("-V", "-p", keys / "site.pub", "-m", message)
    key = minisign.parse_secret_key((keys / "site.key").read_text(), password="correct horse")
    assert key.key_id == minisign.parse_public_key((keys / "site.pub").read_text()).key_id
