"""A node whose crypto asks for FIPS (OpenSSL's default properties ``fips=yes``, as a FIPS
host's configuration sets them) refuses Ed25519: ``check-config`` says so with its reason,
and a signed bundle is refused with ``Ed25519Refused``, never taken for verified nor for a
bad signature (decision 0075). Real ``cryptography``, in a child process whose OpenSSL
reads such a configuration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nodeagent
from nodeagent.bundles import minisign

ROOT = Path(nodeagent.__file__).resolve().parents[1]
FIPS_PROPERTIES = """openssl_conf = openssl_init
[openssl_init]
alg_section = evp_properties
[evp_properties]
default_properties = fips=yes
"""
VERIFY = """
import sys
from pathlib import Path
from nodeagent.bundles import minisign
from nodeagent.errors import NodeAgentError
public = minisign.parse_public_key(Path(sys.argv[1]).read_text())
try:
    minisign.verify(b"bundle", Path(sys.argv[2]).read_text(), {public.key_id: public})
except NodeAgentError as err:
    print(err.reason)
else:
    print("verified")
"""


def signed(tmp_path: Path) -> tuple[str, str]:
    """A public key and a signature of b"bundle", made here (not in FIPS mode)."""
    public_text, secret_text = minisign.generate_keypair()
    signature = minisign.sign(
        b"bundle", minisign.parse_secret_key(secret_text), trusted_comment="fips test"
    )
    (tmp_path / "key.pub").write_text(public_text)
    (tmp_path / "bundle.minisig").write_text(signature)
    return str(tmp_path / "key.pub"), str(tmp_path / "bundle.minisig")


def child(tmp_path: Path, *args: str, fips: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if fips:
        conf = tmp_path / "openssl.cnf"
        conf.write_text(FIPS_PROPERTIES)
        env["OPENSSL_CONF"] = str(conf)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, check=False, timeout=30
    )


def test_check_config_reports_the_refusal_with_its_reason(tmp_path: Path) -> None:
    cmd = ("-m", "nodeagent", "check-config", "--config", str(tmp_path / "absent.toml"))
    shown = child(tmp_path, *cmd, fips=True)
    assert "Ed25519 REFUSED with cryptography" in shown.stdout
    assert "warning: Ed25519Refused:" in shown.stderr
    as_json = json.loads(child(tmp_path, *cmd, "--json", fips=True).stdout)["crypto"]
    assert (as_json["ed25519"], as_json["reason"], as_json["backendFips"]) == (
        "refused", "Ed25519Refused", True,
    )  # fmt: skip
    healthy = json.loads(child(tmp_path, *cmd, "--json", fips=False).stdout)["crypto"]
    assert healthy["ed25519"] == "verifies" and "reason" not in healthy


def test_a_signed_bundle_is_refused_with_the_reason_not_verified(tmp_path: Path) -> None:
    files = signed(tmp_path)
    assert child(tmp_path, "-c", VERIFY, *files, fips=False).stdout.strip() == "verified"
    refused = child(tmp_path, "-c", VERIFY, *files, fips=True)
    assert refused.stdout.strip() == "Ed25519Refused", refused.stderr
