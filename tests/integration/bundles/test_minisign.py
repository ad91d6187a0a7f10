"""nodeagent.bundles.minisign against Debian's real minisign binary, in both directions.

Keys and signatures made by `minisign` are verified by our code; signatures made by our
code are verified by `minisign -V`. Encrypted secret keys need a password typed on a
terminal, so those tests drive minisign through a pseudo-terminal.
"""

from __future__ import annotations

import base64
import os
import re
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.bundles import minisign
from nodeagent.bundles.minisign import PublicKey
from nodeagent.errors import (
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    UnknownSigningKey,
)
from tests.capabilities import skip_for
from tests.testenv.packages import ensure_packages

pytestmark = pytest.mark.integration

MINISIGN = "/usr/bin/minisign"
DEADLINE_S = 60.0
VERIFIED = "Signature and comment signature verified"
PASSWORD = "correct horse battery staple"


@dataclass(frozen=True)
class KeyFiles:
    pub: Path
    key: Path

    @property
    def key_id_hex(self) -> str:
        """The id minisign wrote into the public key's comment."""
        match = re.search(r"minisign public key ([0-9A-F]{1,16})\n", self.pub.read_text())
        assert match is not None, self.pub.read_text()
        return match.group(1)

    def trusted(self, name: str = "release") -> dict[bytes, PublicKey]:
        return minisign.load_trusted_keys({name: self.pub.read_text()})


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MINISIGN, *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )


def run_ok(*args: str | Path) -> str:
    result = run(*args)
    assert result.returncode == 0, f"minisign {args}: {result.stdout}{result.stderr}"
    return result.stdout


def run_with_password(*args: str | Path, password: str) -> bytes:
    """Run minisign on a pseudo-terminal, answering every password prompt."""
    try:
        master, slave = os.openpty()
    except OSError as exc:
        skip_for("pty", f"no pseudo-terminal ({exc}): minisign reads passwords from a terminal")
    process = subprocess.Popen(
        [MINISIGN, *map(str, args)], stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    try:
        output = _answer_prompts(master, password.encode())
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    assert process.wait(timeout=DEADLINE_S) == 0, output.decode(errors="replace")
    return output


def _answer_prompts(master: int, password: bytes) -> bytes:
    output, answered = b"", 0
    deadline = time.monotonic() + DEADLINE_S
    while True:
        ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"minisign did not finish within {DEADLINE_S}s: {output!r}"
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: minisign exited and closed the terminal
            return output
        if not chunk:
            return output
        output += chunk
        if output.count(b"Password") > answered and output.rstrip().endswith(b":"):
            os.write(master, password + b"\n")
            answered += 1


@pytest.fixture(scope="session")
def _minisign_installed() -> None:
    ensure_packages({"minisign": MINISIGN})


def _generate(directory: Path, name: str) -> KeyFiles:
    files = KeyFiles(directory / f"{name}.pub", directory / f"{name}.key")
    run_ok("-G", "-W", "-p", files.pub, "-s", files.key)
    return files


@pytest.fixture
def theirs(tmp_path: Path, _minisign_installed: None) -> KeyFiles:
    return _generate(tmp_path, "theirs")


@pytest.fixture
def ours(tmp_path: Path, _minisign_installed: None) -> KeyFiles:
    public_text, secret_text = minisign.generate_keypair(comment="interop test")
    files = KeyFiles(tmp_path / "ours.pub", tmp_path / "ours.key")
    files.pub.write_text(public_text)
    files.key.write_text(secret_text)
    return files


@pytest.fixture
def message(tmp_path: Path) -> Path:
    path = tmp_path / "bundle.json"
    path.write_bytes(bytes(range(256)) * 12289)  # 3 MiB: several read chunks
    return path


def _minisign_sign(keys: KeyFiles, message: Path, *extra: str) -> str:
    signature = message.with_name(message.name + ".minisig")
    run_ok("-S", "-s", keys.key, "-m", message, "-x", signature, *extra)
    return signature.read_text()


def _minisign_verify(
    keys: KeyFiles, message: Path, signature: str
) -> subprocess.CompletedProcess[str]:
    path = message.with_name("ours.minisig")
    path.write_text(signature)
    return run("-V", "-m", message, "-x", path, "-p", keys.pub)


def _alter(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _with_line(signature: str, index: int, line: str) -> str:
    lines = signature.splitlines()
    lines[index] = line
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- minisign signs, we verify


def test_their_prehashed_signature_verifies_streamed(theirs: KeyFiles, message: Path) -> None:
    signature = _minisign_sign(theirs, message, "-t", "version 1.2.3", "-c", "any")
    with message.open("rb") as stream:
        verified = minisign.verify(stream, signature, theirs.trusted())
    assert verified.trusted_comment == "version 1.2.3"
    assert verified.key_name == "release"
    assert verified.key_id_hex == theirs.key_id_hex
    assert verified.is_prehashed


def test_their_legacy_signature_verifies(theirs: KeyFiles, message: Path) -> None:
    signature = _minisign_sign(theirs, message, "-l", "-t", "legacy")
    assert base64.b64decode(signature.splitlines()[1])[:2] == b"Ed"  # the legacy format
    verified = minisign.verify(message.read_bytes(), signature, theirs.trusted())
    assert (verified.trusted_comment, verified.is_prehashed) == ("legacy", False)


@pytest.mark.parametrize("legacy", [False, True])
def test_their_signature_over_an_altered_file_is_invalid(
    theirs: KeyFiles, message: Path, legacy: bool
) -> None:
    signature = _minisign_sign(theirs, message, *(["-l"] if legacy else []))
    _alter(message)
    with pytest.raises(SignatureInvalid, match="does not match the signed content"):
        minisign.verify(message.read_bytes(), signature, theirs.trusted())


def test_their_signature_with_an_altered_trusted_comment_is_invalid(
    theirs: KeyFiles, message: Path
) -> None:
    signature = _minisign_sign(theirs, message, "-t", "version 1.2.3")
    forged = _with_line(signature, 2, "trusted comment: version 9.9.9")
    with pytest.raises(SignatureInvalid, match="trusted comment"):
        minisign.verify(message.read_bytes(), forged, theirs.trusted())
    assert run("-V", "-m", message, "-p", theirs.pub).returncode == 0  # the original is fine


def test_signature_by_an_untrusted_key_names_its_key_id(
    theirs: KeyFiles, message: Path, tmp_path: Path
) -> None:
    stranger = _generate(tmp_path, "stranger")
    signature = _minisign_sign(stranger, message)
    with pytest.raises(UnknownSigningKey) as info:
        minisign.verify(message.read_bytes(), signature, theirs.trusted())
    assert stranger.key_id_hex in str(info.value)
    assert f"{theirs.key_id_hex} (release)" in str(info.value)


def test_empty_truncated_and_garbage_signature_files(theirs: KeyFiles, message: Path) -> None:
    signature = _minisign_sign(theirs, message)
    trusted = theirs.trusted()
    with pytest.raises(SignatureMissing):
        minisign.verify(message.read_bytes(), "", trusted)
    with pytest.raises(SignatureMalformed, match="this one has 2"):
        minisign.verify(message.read_bytes(), "\n".join(signature.splitlines()[:2]), trusted)
    with pytest.raises(SignatureMalformed):
        minisign.verify(message.read_bytes(), message.read_bytes()[:4096], trusted)


# ---------------------------------------------------------------- we sign, minisign verifies


def test_minisign_verifies_our_signature(ours: KeyFiles, message: Path) -> None:
    secret = minisign.parse_secret_key(ours.key.read_text())
    with message.open("rb") as stream:
        signature = minisign.sign(stream, secret, trusted_comment="file:bundle.json\tv1")
    result = _minisign_verify(ours, message, signature)
    assert result.returncode == 0, result.stderr
    assert VERIFIED in result.stdout
    assert "Trusted comment: file:bundle.json\tv1" in result.stdout
    strict = run("-V", "-H", "-m", message, "-x", message.with_name("ours.minisig"), "-p", ours.pub)
    assert strict.returncode == 0, strict.stderr  # -H: prehashed signatures only


def test_minisign_rejects_our_signature_over_an_altered_file(ours: KeyFiles, message: Path) -> None:
    secret = minisign.parse_secret_key(ours.key.read_text())
    signature = minisign.sign(message.read_bytes(), secret, trusted_comment="t")
    _alter(message)
    result = _minisign_verify(ours, message, signature)
    assert result.returncode != 0
    assert VERIFIED not in result.stdout


def test_minisign_rejects_our_signature_with_an_altered_comment(
    ours: KeyFiles, message: Path
) -> None:
    secret = minisign.parse_secret_key(ours.key.read_text())
    signature = minisign.sign(message.read_bytes(), secret, trusted_comment="t")
    result = _minisign_verify(ours, message, _with_line(signature, 2, "trusted comment: u"))
    assert result.returncode != 0
    assert VERIFIED not in result.stdout


def test_we_sign_with_their_secret_key(theirs: KeyFiles, message: Path) -> None:
    secret = minisign.parse_secret_key(theirs.key.read_text())
    assert secret.public_key() == minisign.parse_public_key(theirs.pub.read_text())
    signature = minisign.sign(message.read_bytes(), secret, trusted_comment="made by nodeagent")
    result = _minisign_verify(theirs, message, signature)
    assert result.returncode == 0, result.stderr
    assert VERIFIED in result.stdout


def test_minisign_signs_with_our_secret_key(ours: KeyFiles, message: Path) -> None:
    signature = _minisign_sign(ours, message, "-t", "made by minisign")
    assert run("-V", "-m", message, "-p", ours.pub).returncode == 0
    verified = minisign.verify(message.read_bytes(), signature, ours.trusted("ours"))
    assert (verified.trusted_comment, verified.key_name) == ("made by minisign", "ours")


def test_recreated_public_key_matches_ours(ours: KeyFiles, tmp_path: Path) -> None:
    recreated = tmp_path / "recreated.pub"
    run_ok("-R", "-s", ours.key, "-p", recreated)
    ours_key = minisign.parse_public_key(ours.pub.read_text())
    assert minisign.parse_public_key(recreated.read_text()) == ours_key


# ---------------------------------------------------------------- encrypted secret keys


@pytest.fixture(scope="session")
def encrypted(tmp_path_factory: pytest.TempPathFactory, _minisign_installed: None) -> KeyFiles:
    directory = tmp_path_factory.mktemp("encrypted")
    files = KeyFiles(directory / "enc.pub", directory / "enc.key")
    run_with_password("-G", "-p", files.pub, "-s", files.key, password=PASSWORD)
    return files


def test_encrypted_secret_key_of_minisign_opens_and_signs(
    encrypted: KeyFiles, message: Path
) -> None:
    header = base64.b64decode(encrypted.key.read_text().splitlines()[1])[:6]
    assert header == b"EdScB2"  # scrypt-encrypted
    secret = minisign.parse_secret_key(encrypted.key.read_text(), password=PASSWORD)
    assert secret.public_key() == minisign.parse_public_key(encrypted.pub.read_text())
    signature = minisign.sign(message.read_bytes(), secret, trusted_comment="encrypted key")
    result = _minisign_verify(encrypted, message, signature)
    assert result.returncode == 0, result.stderr
    assert VERIFIED in result.stdout


def test_minisign_signs_with_its_encrypted_key_and_we_verify(
    encrypted: KeyFiles, message: Path
) -> None:
    signature_path = message.with_name("enc.minisig")
    run_with_password(
        "-S",
        "-s",
        encrypted.key,
        "-m",
        message,
        "-x",
        signature_path,
        "-t",
        "enc",
        password=PASSWORD,
    )
    verified = minisign.verify(
        message.read_bytes(), signature_path.read_text(), encrypted.trusted()
    )
    assert verified.trusted_comment == "enc"
