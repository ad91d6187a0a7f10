"""bundle.json, signatures and key files: the crash inputs of issue 13 each end in the
reason code of its rule, with a short escaped message, in linear time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from nodeagent.adapters.bundles.tree import load_trusted_keys_dir
from nodeagent.bundles import manifest as bundle
from nodeagent.bundles import minisign
from nodeagent.errors import (
    BundleFormatUnsupported,
    BundleManifestInvalid,
    KeyMalformed,
    NodeAgentError,
    SignatureMalformed,
)
from tests.unit.bundles.test_manifest import manifest_doc

GOOD = json.dumps(manifest_doc()).encode()


def with_created(value: str) -> bytes:
    return json.dumps(manifest_doc(created=value)).encode()


MANIFESTS: list[tuple[bytes, type[NodeAgentError], str]] = [
    (GOOD.replace(b'"formatVersion": 1', b'"formatVersion": NaN'), BundleManifestInvalid, "NaN"),
    (GOOD.replace(b'"formatVersion": 1', b'"formatVersion": true'), BundleManifestInvalid, "bool"),
    (GOOD.replace(b'"formatVersion": 1', b'"formatVersion": 4'), BundleFormatUnsupported, "4"),
    (b'{"formatVersion": 1, "formatVersion": 1}', BundleManifestInvalid, "duplicate key"),
    (b"\xff\xfe" + GOOD.decode().encode("utf-16-le"), BundleManifestInvalid, "UTF-16"),
    (GOOD.decode().encode("utf-16-le"), BundleManifestInvalid, "NUL"),
    (b"[" * 600 + b"]" * 600, BundleManifestInvalid, "nested 600 deep"),
    (b"{" + b'"a":1,' * 300_000 + b'"b":1}', BundleManifestInvalid, "more than 250000 values"),
    (b'{"formatVersion": 1' + b"9" * 4300 + b"}", BundleManifestInvalid, "digits"),
    (b'{"formatVersion": "q\\ud800"}', BundleManifestInvalid, "lone surrogate"),
    (with_created("x" * 10_000_000), BundleManifestInvalid, "…("),
    (with_created("\x1b]0;owned\x07"), BundleManifestInvalid, "must be an RFC 3339"),
    (b"{" + b" " * (bundle.MAX_MANIFEST_BYTES + 1) + b"}", BundleManifestInvalid, "allowed"),
]


@pytest.mark.parametrize(("data", "error", "fragment"), MANIFESTS)
def test_a_bad_manifest_has_its_reason_and_a_short_message(
    data: bytes, error: type[NodeAgentError], fragment: str
) -> None:
    started = time.monotonic()
    with pytest.raises(error) as caught:
        bundle.parse_manifest(data)
    assert time.monotonic() - started < 5
    assert type(caught.value) is error
    assert fragment in caught.value.message
    assert len(caught.value.message) < 600
    assert "\x1b" not in caught.value.message


SIGNATURE_LINES = [
    "untrusted comment: x",
    "RUQ" + "A" * 133,
    "trusted comment: t",
    "A" * 86 + "==",
]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("\n".join(SIGNATURE_LINES).replace("trusted comment: t", "t" * 100_000), "bytes, more"),
        ("untrusted comment: \ud800\n" + "\n".join(SIGNATURE_LINES[1:]), "holds"),
        ("x\n" * 10_000, "bytes, more"),
        ("\n".join(SIGNATURE_LINES[:3]), "has 3"),
    ],
)
def test_a_bad_signature_is_malformed_not_a_crash(text: str, fragment: str) -> None:
    with pytest.raises(SignatureMalformed) as caught:
        minisign.parse_signature(text)
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    "text", ["untrusted comment: k\n" + "R" * 1_000_000, "\x00" * 5000, "RWQ\ud800"]
)
def test_a_bad_public_key_is_malformed(text: str) -> None:
    with pytest.raises(KeyMalformed):
        minisign.parse_public_key(text, name="site\x1b[2J")


def test_trusted_key_files_are_read_within_bounds(tmp_path: Path) -> None:
    (tmp_path / "huge.pub").write_bytes(b"untrusted comment: x\n" + b"R" * 50_000_000)
    with pytest.raises(KeyMalformed, match="a minisign key file is under 4 KiB"):
        load_trusted_keys_dir(tmp_path)
    (tmp_path / "huge.pub").write_bytes(b"untrusted comment: \xff\xfe\nRWQ\n")
    with pytest.raises(KeyMalformed) as caught:
        load_trusted_keys_dir(tmp_path)
    assert "public key 'huge'" in caught.value.message
